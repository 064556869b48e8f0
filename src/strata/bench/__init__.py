"""The benchmarks' library: what `strata bench`, `strata bench pool` and benchmarks/*.py measure and report.

rates (what this machine moves, measured here), limit (a decoded token's limit at those rates), default_model
(the benchmark model, synthesized once), decode and prompt (a session's decode and prompt path speed), report
(their lines), run (a loaded model's bench, and the expert cache sweep), pool_experts, pool and pool_groups (the
CPU expert pool alone), server and server_process (concurrent clients against a server, and the server measured
in a child process), records (JSON). Nothing here parses a command line or writes to stdout: every report line
goes to the `emit` its caller passes (the benchmark model's one-time synth is said on stderr, as load's progress
is).
"""
