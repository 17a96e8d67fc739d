#!/usr/bin/env bash
# Mutation testing of tfx's numerical core with mutmut 3 (pip install -e ".[dev]"); not part of CI.
#
#   scripts/audit/mutation_check.sh                  # every module below, each against its own fast tests
#   scripts/audit/mutation_check.sh optim criterion  # some of them
#   MUTATION_TESTS=all scripts/audit/mutation_check.sh optim   # against the whole fast suite (slow)
#   MUTATION_REPO=/other/checkout scripts/audit/mutation_check.sh optim   # measure another tree's tests
#   MUTATION_FILTER='tfx.evaluation.decode.x_length_normalized* tfx.evaluation.decode.x__finish*' scripts/audit/mutation_check.sh decode
#       # only the mutants whose names match (mutmut's globs): the score covers the mutants checked
#   MUTATION_TIMEOUT=5 scripts/audit/mutation_check.sh decode
#       # a mutant is a timeout (detected) past 5x its tests' clean time (mutmut's default: 15x)
#
# Each module is mutated in its own scratch copy of the tree (mutmut writes a mutants/ folder and
# reads one [tool.mutmut] config), so runs never touch the working tree. Prints killed/survived per
# module, then the surviving mutants (`mutmut show NAME` in the scratch folder shows a diff).
# Runs at nice 19 with MUTATION_CHILDREN (default 1) parallel workers, each test process on one
# OpenMP thread: mutmut's timeout is a CPU-time limit, and idle OpenMP threads spinning on a busy
# machine burn CPU time, which turned equivalent mutants into false timeouts (detected) at 3x.
set -euo pipefail

REPO=$(cd "${MUTATION_REPO:-$(dirname "$0")/../..}" && pwd)
WORK=${MUTATION_WORK:-${TMPDIR:-/tmp}/tfx-mutation}
CHILDREN=${MUTATION_CHILDREN:-1}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
declare -A SOURCES=(
  [init]="tfx/init/*" [criterion]="tfx/optim/loss.py" [optim]="tfx/optim/optimizers.py" [decode]="tfx/evaluation/decode.py"
  [average]="tfx/evaluation/average.py" [model]="tfx/model/*" [batching]="tfx/data/batching.py"
)
declare -A TESTS=(
  [init]="tests/init" [criterion]="tests/optim/test_loss.py" [optim]="tests/test_optim*.py"
  [decode]="tests/evaluation/test_decode.py" [average]="tests/test_average*.py" [model]="tests/model"
  [batching]="tests/data/test_batching.py"
)
# Fast tests left out of a module's mutation runs: slow per mutant and checking no arithmetic
# (the 200+200-layer test checks memory and finiteness at depth; it runs in the fast suite).
declare -A SKIP=(
  [model]="tests/model/test_transformer.py::test_200_plus_200_layers_forward_backward"
)
MODULES=("$@")
[ ${#MODULES[@]} -eq 0 ] && MODULES=(init criterion optim decode average model batching)

for module in "${MODULES[@]}"; do
  if [ -z "${SOURCES[$module]+x}" ]; then
    echo "unknown module '$module': choose from ${!SOURCES[*]}" >&2
    exit 2
  fi
done

summary=()
for module in "${MODULES[@]}"; do
  dir="$WORK/$module"
  rm -rf "$dir" && mkdir -p "$dir"
  (cd "$REPO" && tar -cf - --exclude=mutants --exclude=__pycache__ --exclude=data/cache \
      tfx tests conf scripts data pyproject.toml) | tar -xf - -C "$dir"
  if [ "${MUTATION_TESTS:-own}" = all ]; then
    tests='"tests"'
  else
    tests=$(cd "$dir" && for t in ${TESTS[$module]}; do printf '"%s", ' "$t"; done)
  fi
  skip=$(for t in ${SKIP[$module]:-}; do printf '"--deselect", "%s", ' "$t"; done)
  # Replace the [tool.mutmut] table with this module's: its source files, its tests.
  python - "$dir/pyproject.toml" "${SOURCES[$module]}" "$tests" "$skip" "${MUTATION_TIMEOUT:-15}" <<'PY'
import re
import sys

path, pattern, tests, skip, timeout = sys.argv[1:]
text = re.sub(r"\n\[tool\.mutmut\]\n(?:(?!\n\[).)*", "", open(path).read(), flags=re.S)
text += f"""
[tool.mutmut]
source_paths = ["tfx/"]
only_mutate = ["{pattern}"]
pytest_add_cli_args = [{skip}"-m", "not slow", "-p", "no:cacheprovider"]
pytest_add_cli_args_test_selection = [{tests}]
also_copy = ["conf/", "tests/", "scripts/", "data/"]
timeout_multiplier = {timeout}
"""
open(path, "w").write(text)
PY
  echo "== $module: mutating ${SOURCES[$module]} against ${TESTS[$module]}${SKIP[$module]:+ except ${SKIP[$module]}} (in $dir)"
  # shellcheck disable=SC2086  # MUTATION_FILTER is a list of globs
  (cd "$dir" && nice -n 19 mutmut run --max-children "$CHILDREN" ${MUTATION_FILTER:-} >mutmut.log 2>&1) || {
    echo "mutmut failed for $module: see $dir/mutmut.log" >&2
    tail -20 "$dir/mutmut.log" >&2
    continue
  }
  line=$(cd "$dir" && python - "$module" <<'PY'
import collections
import json
import pathlib
import sys

from mutmut.stats import status_by_exit_code

module = sys.argv[1]
count = collections.Counter()
for meta in pathlib.Path("mutants").rglob("*.meta"):
    for code in json.loads(meta.read_text())["exit_code_by_key"].values():
        count[status_by_exit_code[code]] += 1
checked = sum(n for status, n in count.items() if status != "not checked")
killed = count["killed"] + count["timeout"]  # a timeout is a detected mutant
other = {k: v for k, v in count.items() if k not in ("killed", "timeout", "survived")}
score = 100 * killed / max(checked, 1)
print(f"{module:<10} killed {killed:>4} / {checked:<4} ({score:5.1f} %)  survived {count['survived']:>4}  {other or ''}")
PY
)
  summary+=("$line")
  echo "$line"
  (cd "$dir" && mutmut results | grep -v ': not checked$' | sed 's/^/    /') || true
done

echo
echo "== mutation scores: killed (timeouts included) / mutants checked; other statuses listed"
printf '%s\n' "${summary[@]}"
