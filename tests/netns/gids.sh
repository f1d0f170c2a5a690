#!/usr/bin/env bash
# A soft device's GID table follows its interface's addresses: opened on an interface with no
# address and no carrier, it gains GIDs as addresses appear and carries RC traffic on them;
# an address that goes leaves its entry zero, and the next one takes that index again. The
# test (crates/monel-verbs/tests/gid_table.rs) makes a network namespace of its own, on its
# thread, with a veth pair in it: run as root.
#   gids.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo test --release --locked -q -p monel-verbs --test gid_table -- --ignored
echo "PASS gids: the GID table followed addresses as they came and went"
