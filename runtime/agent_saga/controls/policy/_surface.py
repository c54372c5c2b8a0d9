"""The recorded tool surface in the policy plane: what agents were seen calling.

    P:v1:surface:<ns>/<agent>   HASH   tool name -> surface entry (JSON, see _skeleton)
    P:v1:surface:index          SET    "<ns>/<agent>" of every surface hash

Written by agents while an Observe-mode SagaPolicy governs them (and by the MCP proxy in
``--observe``), read by ``agent-saga policy skeleton``. Entries merge: several processes
of one agent add their calls to the same field (``LUA_RECORD``).

Invariants:
- A record is one script: the entry and the index entry change together; ``calls`` add
  up, ``firstSeen`` keeps the earliest, ``lastSeen`` the latest, policy argument names
  are united; the input schema and the declared semantics are the latest seen.
- No argument value is ever recorded: names, semantics and schemas only (no secrets).
- Reading skips (and reports) an entry it cannot parse; it never guesses.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from ..._redis import script
from ._skeleton import SurfaceEntry

__all__ = ["LUA_RECORD", "read_surface", "record_surface", "surface_key", "surface_index_key"]

# KEYS[1] the agent's surface hash   KEYS[2] the surface index
# ARGV[1] "<ns>/<agent>"   ARGV[2..] alternating tool name, entry JSON (this process's delta)
LUA_RECORD = """
for i = 2, #ARGV, 2 do
  local tool, new = ARGV[i], cjson.decode(ARGV[i + 1])
  local raw = redis.call('HGET', KEYS[1], tool)
  if raw then
    local ok, old = pcall(cjson.decode, raw)
    if ok and type(old) == 'table' and old['v'] == 1 then
      new['calls'] = (tonumber(old['calls']) or 0) + (tonumber(new['calls']) or 0)
      new['firstSeen'] = math.min(tonumber(old['firstSeen']) or new['firstSeen'], new['firstSeen'])
      new['lastSeen'] = math.max(tonumber(old['lastSeen']) or 0, new['lastSeen'])
      local names, seen = {}, {}
      for _, list in ipairs({old['policyArgs'] or {}, new['policyArgs'] or {}}) do
        if type(list) == 'table' then
          for _, n in ipairs(list) do
            if not seen[n] then seen[n] = true; names[#names + 1] = n end
          end
        end
      end
      table.sort(names)
      new['policyArgs'] = names
      if new['inputSchema'] == cjson.null and old['inputSchema'] ~= nil then new['inputSchema'] = old['inputSchema'] end
    end
  end
  if type(new['policyArgs']) == 'table' and #new['policyArgs'] == 0 then new['policyArgs'] = nil end
  redis.call('HSET', KEYS[1], tool, cjson.encode(new))
end
redis.call('SADD', KEYS[2], ARGV[1])
return #ARGV / 2
"""


def surface_key(prefix: str, namespace: str, agent: str) -> str:
    """``P:v1:surface:<ns>/<agent>`` (``prefix`` is ``P:v1``)."""
    return f"{prefix}:surface:{namespace}/{agent}"


def surface_index_key(prefix: str) -> str:
    return f"{prefix}:surface:index"


def record_surface(client: Any, prefix: str, namespace: str, agent: str,
                   entries: Iterable[Mapping[str, Any]]) -> int:
    """Merge ``entries`` (``surface_entry_doc`` documents, ``calls`` being this
    process's new calls) into the agent's surface. Returns how many tools were written."""
    args: list[str] = [f"{namespace}/{agent}"]
    for e in entries:
        args += [str(e["tool"]), json.dumps(dict(e), separators=(",", ":"), sort_keys=True)]
    if len(args) == 1:
        return 0
    run = script(client, LUA_RECORD)  # the one-slot guard on a cluster, NOSCRIPT reloaded
    return int(run(keys=[surface_key(prefix, namespace, agent), surface_index_key(prefix)], args=args,
                      client=client))


def read_surface(client: Any, prefix: str, namespace: str, agent: str | None = None
                 ) -> tuple[list[SurfaceEntry], list[str]]:
    """The entries recorded for ``namespace`` (one agent, or every agent), and the
    problems met (unreadable entries, skipped)."""
    members = sorted(m.decode() if isinstance(m, bytes) else str(m)
                     for m in client.smembers(surface_index_key(prefix)))
    ids = [m for m in members if m.startswith(namespace + "/") and (agent is None or m == f"{namespace}/{agent}")]
    entries: list[SurfaceEntry] = []
    problems: list[str] = []
    for id_ in ids:
        name = id_.split("/", 1)[1]
        for tool, raw in sorted(client.hgetall(f"{prefix}:surface:{id_}").items()):
            t = tool.decode() if isinstance(tool, bytes) else str(tool)
            try:
                entries.append(SurfaceEntry.from_doc(json.loads(raw), agent=name))
            except (ValueError, TypeError) as exc:
                problems.append(f"{id_} {t}: {exc} (skipped)")
    return entries, problems
