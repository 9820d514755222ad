"""Privacy, utility and cost metrics: every module here registers its metrics under the schema of
bench/protocol/evidence.py (bench.registry discovers them)."""
