"""Built-in defenses; importing the package registers each one."""
from defenses import dictpfl, dp, maskcrypt, plaintext, selective, selectiveshield, sensecrypt  # noqa: F401
