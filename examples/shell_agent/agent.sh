#!/usr/bin/env bash
# A calculator agent in shell: curl for the model, jq for JSON, bc for the sums. No Python involved.
# agentrl starts it once per episode: the task row on stdin, OPENAI_BASE_URL/OPENAI_API_KEY set.
set -euo pipefail
task=$(cat)
question=$(jq -r .question <<<"$task")
tools='[{"type":"function","function":{"name":"calculator","description":"Evaluate + - * / and parentheses.",
  "parameters":{"type":"object","properties":{"expression":{"type":"string"}},"required":["expression"]}}}]'
messages=$(jq -n --arg q "$question" '[{role: "user", content: $q}]')
ask() {
  jq -n --arg model "${AGENT_MODEL:-policy}" --argjson m "$messages" --argjson t "$tools" \
    '{model: $model, messages: $m, tools: $t}' |
    curl -sf "$OPENAI_BASE_URL/chat/completions" -H "Authorization: Bearer $OPENAI_API_KEY" \
      -H "Content-Type: application/json" -d @- | jq -c '.choices[0].message'
}
answer=""
for _ in 1 2 3; do
  reply=$(ask)
  messages=$(jq -c --argjson r "$reply" '. + [$r | del(.. | nulls)]' <<<"$messages")
  if [ "$(jq '.tool_calls | length' <<<"$reply")" = 0 ]; then answer=$(jq -r '.content // ""' <<<"$reply"); break; fi
  while read -r call; do
    expression=$(jq -r '.function.arguments | fromjson | .expression // ""' <<<"$call")
    result=$(echo "scale=6; $expression" | bc 2>/dev/null | sed 's/\.0*$//' || echo "error")
    messages=$(jq -c --arg id "$(jq -r .id <<<"$call")" --arg r "${result:-error}" \
      '. + [{role: "tool", tool_call_id: $id, name: "calculator", content: $r}]' <<<"$messages")
  done < <(jq -c '.tool_calls[]' <<<"$reply")
done
guess=$(grep -oE -- '-?[0-9]+(\.[0-9]+)?' <<<"$answer" | tail -1 || true)
expected=$(jq -r .answer <<<"$task")
if [ -n "$guess" ] && [ "$(echo "$guess == $expected" | bc)" = 1 ]; then echo '{"reward": 1.0, "success": true}'
else echo '{"reward": 0.0, "success": false}'; fi
