"""Built-in defenses; importing the package registers each one."""
from defenses import (base, dictpfl, dp, maskcrypt, noise, plaintext, selective, selectiveshield,  # noqa: F401
                      sensecrypt, shelora)
