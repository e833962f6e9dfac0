"""What Veil's tests and benchmarks share (installed by the `dev` extra; never in the wheel).

- processes: free ports, children that die with their parent, start/cleanup as a context
  manager, and `veil serve` as a killable, restartable process (ServeProcess)
- waiting: wait_until, the one polling loop
- data: zipf_shares, the skewed category law of the statistical tests and the benchmarks
- redis_server, redis_cluster: real redis-server processes and Redis Clusters on free ports
- chromium: headless Chromium over the DevTools protocol
- config_toml: aggregator configs as TOML text
- running: the daemon tests' metrics, configs, in-process aggregators, tokens and uploads
- promtool: promtool's lint of /metrics text
- planted_strings: a strings metric's verification round over planted values, as served
- pki: a throwaway CA with server and client certificates
- wheel: Veil's wheel built from a source tree (build_wheel)
- benchlib: what every benchmark script shares (machine facts, timer, results files)
"""
