#!/usr/bin/env bash
# The review a pull request that changes a SagaPolicy gets (docs/gitops.md):
#
#   APPROVALS=N bash examples/gitops/review.sh OLD NEW AUDIT [AGENT]
#
# OLD: the SagaPolicy file in force (the target branch's); NEW: the proposed one; AUDIT:
# an exported audit bundle (`agent-saga export`) of the agents' log; AGENT: the agent the
# policy governs (what its appliesTo matches). Writes review.markdown (a pull-request comment)
# and exits 0 when the change may merge: valid, the log verifies, and nothing gets looser
# unless the change has a second approval (APPROVALS >= 2). Exit 1 otherwise.
set -u
old=$1 new=$2 audit=$3 agent=${4:-payments-agent}
approvals=${APPROVALS:-0}

agent-saga policy check "$new" || exit 1
agent-saga verify-bundle "$audit" > /dev/null || { echo "the audit bundle $audit does not verify"; exit 1; }

agent-saga policy diff "$old" "$new" --markdown > review.markdown
diff=$?
agent-saga policy replay "$new" --current "$old" --agent "$agent" --wal-path "$audit" --since 30d --markdown >> review.markdown
replay=$?
cat review.markdown

if [ "$diff" = 2 ] || [ "$replay" = 2 ]; then
  echo "the review could not run (see above)"
  exit 1
fi
if [ "$diff" = 3 ] || [ "$replay" = 3 ]; then
  if [ "$approvals" -lt 2 ]; then
    echo "this change loosens the policy: it needs a second approval ($approvals so far)"
    exit 1
  fi
  echo "this change loosens the policy and has $approvals approvals"
fi
exit 0
