"""Built-in attacks; importing the package registers each one."""
from attacks import baselines, idlg, ilrg, mia  # noqa: F401
