"""GPUs: which one each process uses (`pin`, with the pure rules in
`pinning`) and what NVML says about it (`nvml`, with the pure formatting of
its readings for Keras logs in `stats_logs`).

What may import it: the callbacks, the recipes, the CLI and the top-level
package. It imports `hvdkeras.engine` (the world: local rank and size).
"""
