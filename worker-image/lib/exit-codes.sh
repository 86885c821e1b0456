# Generated from reconciler/domain/exit_statuses.py WORKER_EXITS: do not edit. Regenerate with
#   .venv/bin/python -c 'from reconciler.domain.exit_statuses import render_worker_exit_codes as r; print(r(), end="")' > worker-image/lib/exit-codes.sh
# The worker's own exit codes (a failing tool's own code is passed through): code, meaning, and whom the
# judge blames for it (its message decides: the signature named in the table).
# shellcheck shell=bash disable=SC2034
readonly FLEET_EXIT_CONFIG=64  # missing or bad environment (blame: image)
readonly FLEET_EXIT_DATA=65  # a params file failed its checksum twice (blame: network)
readonly FLEET_EXIT_NOINPUT=66  # the benchmark input (c1.json) is missing (blame: params)
readonly FLEET_EXIT_UNAVAILABLE=69  # no params source (blame: configuration)
readonly FLEET_EXIT_SOFTWARE=70  # a tool exited 0 without usable output (blame: image)
readonly FLEET_EXIT_PROOF_FAILED=75  # the warm-up proof came back FAILED/CANCELLED/TIMEOUT/UNKNOWN (blame: unknown)
readonly FLEET_EXIT_MANIFEST=76  # the mirror's manifest is malformed or empty (blame: params)
readonly FLEET_EXIT_BUDGET=78  # the daemon's memory budget cannot hold the SRS (blame: configuration)
readonly FLEET_EXIT_TIMEOUT=124  # a deadline passed (params, daemon readiness, warm-up, benchmark) (blame: unknown)
