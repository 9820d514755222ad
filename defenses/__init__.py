"""Built-in defenses; importing the package registers each one."""
from defenses import base, dictpfl, dp, maskcrypt, plaintext, selective, selectiveshield, sensecrypt  # noqa: F401
