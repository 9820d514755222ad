"""Built-in attacks: every module here registers what it defines (bench.registry discovers them)."""
