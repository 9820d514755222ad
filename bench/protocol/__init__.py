"""The protocol: what travels between parties (wire), what the aggregation server sees of it and knows
(view), and the contracts plugins implement: Defense (hooks the engine calls), Attack (a view in, a
reconstruction out), Evidence/Metric (what a metric may read). Nothing here runs a federation."""
