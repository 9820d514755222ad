"""Running suites: parsing them (spec), load-time checks (preflight), computing a group's cells (cells),
driving groups through an executor (runner, executors) with leases on the store (leases), the results
store (store), what code computed a result (version) and reconstruction thumbnails (thumbnails)."""
