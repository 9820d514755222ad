"""Built-in defenses; importing the package registers each one."""
from defenses import dp, maskcrypt, plaintext, selective  # noqa: F401
