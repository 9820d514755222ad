"""Built-in defenses; importing the package registers each one."""
from defenses import plaintext  # noqa: F401
