"""veil.aggregator: the daemon side of Veil (numpy, numba, redis). Never imported by the SDK."""
