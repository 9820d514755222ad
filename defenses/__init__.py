"""Built-in defenses; importing the package registers each one."""
from defenses import dp, maskcrypt, plaintext, selective, selectiveshield  # noqa: F401
