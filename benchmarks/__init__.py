"""playbook's benchmarks: each case is a ratio against a baseline measured in the same run."""
