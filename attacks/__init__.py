"""Built-in attacks; importing the package registers each one."""
from attacks import idlg  # noqa: F401
