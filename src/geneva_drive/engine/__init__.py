"""Running steps: pure outcome plans, the one writer of row states, scheduling, the executor's
phases, signals, starting workflows, operator verbs, resumable iteration, leases."""
