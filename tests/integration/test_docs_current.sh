#!/usr/bin/env bash
# docs/COMMANDS.md must be what the binaries print for --help (regenerate: scripts/gen_command_docs.sh).
source "$(dirname "$0")/lib.sh"
bash "$DFM_ROOT/scripts/gen_command_docs.sh" "$WORK/COMMANDS.md" >/dev/null
diff -u "$DFM_ROOT/docs/COMMANDS.md" "$WORK/COMMANDS.md" ||
  fail "docs/COMMANDS.md is stale: run scripts/gen_command_docs.sh and commit it"
ok "docs/COMMANDS.md matches every command's --help"
