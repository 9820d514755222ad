"""Built-in defenses: every module here registers what it defines (bench.registry discovers them)."""
