"""The SQL statements of the SQLite store, as constants (no logic).

States are numbers: 0 pending, 1 claimed, 2 settled, 3 exhausted, 4 skipped.
"""

from __future__ import annotations

# A batch travels as ONE JSON text, [[chat_id, state, update], ...], so every statement is one step whatever the
# batch size. The stored payload is SQLite's minified rendering of the update, so payloads compare as text.
EXISTING_IN_BATCH = """
SELECT json_group_array(json_array(u.update_id, u.payload = j.value -> '$[2]'))
FROM json_each(:batch) AS j JOIN fence_updates AS u ON u.update_id = j.value ->> '$[2].update_id'
"""
# Whether any id of the batch may already be stored (a fresh batch skips the payload comparison).
ANY_IN_RANGE = "SELECT EXISTS (SELECT 1 FROM fence_updates WHERE update_id BETWEEN ? AND ?)"
INSERT_BATCH = """
INSERT INTO fence_updates(update_id, payload, chat_id, state, attempt, due_at, recorded_at, changed_at)
SELECT j.value ->> '$[2].update_id', j.value -> '$[2]', j.value ->> 0, j.value ->> 1, 0, 0, :now, :now
FROM json_each(:batch) AS j WHERE true
ON CONFLICT(update_id) DO NOTHING
"""
# The same, with the payloads taken from Telegram's getUpdates answer as it came and the rest of each row from :ids,
# :chats and :states. An item is stored only where SQLite reads the update_id the caller parsed at its place (two
# "update_id" keys: Python keeps the last, SQLite the first); a body with two "result" keys stores nothing.
INSERT_BODY = """
INSERT INTO fence_updates(update_id, payload, chat_id, state, attempt, due_at, recorded_at, changed_at)
SELECT u.update_id, json(u.value), :chats ->> u.k, u.state, 0, 0, :now, :now
FROM (SELECT j.key AS k, j.value AS value, j.value ->> 'update_id' AS update_id, :states ->> j.key AS state
      FROM (SELECT jsonb(:body) AS b) AS a, jsonb_each(a.b, '$.result') AS j
      WHERE (SELECT count(*) FROM jsonb_each(a.b) WHERE key = 'result') = 1) AS u
WHERE u.update_id = :ids ->> u.k
ON CONFLICT(update_id) DO NOTHING
"""
# Which of the batch's ids are stored already (without comparing payloads).
EXISTING_IDS = (
    "SELECT json_group_array(update_id) FROM fence_updates WHERE update_id IN (SELECT value FROM json_each(?))"
)
# The error of an update stored as an exhaustion because its payload cannot be stored.
POISONED = "UPDATE fence_updates SET error = ? WHERE update_id = ? AND state = 3"
RAISE_CURSOR = (
    "INSERT INTO fence_meta(key, value) VALUES ('cursor', ?) "
    "ON CONFLICT(key) DO UPDATE SET value = max(value, excluded.value)"
)
READ_CURSOR = "SELECT value FROM fence_meta WHERE key = 'cursor'"
# How often an update id was recorded again with another payload (the first kept): a counter in fence_meta.
ADD_PAYLOAD_CONFLICTS = (
    "INSERT INTO fence_meta(key, value) VALUES ('payload_conflicts', ?) "
    "ON CONFLICT(key) DO UPDATE SET value = value + excluded.value"
)
READ_PAYLOAD_CONFLICTS = "SELECT value FROM fence_meta WHERE key = 'payload_conflicts'"

# Open rows due now in update_id order (an expired claim is due) whose chat has no live claim and no older row
# waiting for its retry. One row: the first :scan as [[update_id, chat_id, attempt, payload if :with_payload], ...].
CANDIDATES = """
SELECT json_group_array(json_array(update_id, chat_id, attempt,
                                   CASE WHEN :with_payload THEN json(payload) END)) FROM (
  SELECT update_id, chat_id, attempt, payload FROM fence_updates AS u
  WHERE state < 2 AND due_at <= :now
    AND (chat_id IS NULL OR (NOT EXISTS (
          SELECT 1 FROM fence_updates AS c
          WHERE c.state = 1 AND c.chat_id = u.chat_id AND c.due_at > :now) AND NOT EXISTS (
          SELECT 1 FROM fence_updates AS w INDEXED BY fence_updates_open_chat
          WHERE w.state < 2 AND w.state = 0 AND w.chat_id = u.chat_id AND w.update_id < u.update_id
            AND w.due_at > :now)))
  ORDER BY update_id LIMIT :scan)
"""
# The next open due row of each given chat that has no live claim and no older row waiting for its retry, and
# the given chatless updates, as ONE row [[update_id, chat_id, attempt], ...] in no particular order (the caller
# orders them, keeps the first of its limit and leaves out rows whose attempts are spent). One index probe per chat
# (no ORDER BY ... LIMIT over the two parts: SQLite would merge them through temporary b-trees).
HEADS = """
SELECT json_group_array(json_array(update_id, chat_id, attempt)) FROM (
  SELECT u.update_id, u.chat_id, u.attempt FROM json_each(:chats) AS j JOIN fence_updates AS u ON u.update_id IN (
    SELECT o.update_id FROM fence_updates AS o
    WHERE o.state < 2 AND o.chat_id = j.value AND o.due_at <= :now ORDER BY o.update_id LIMIT 1)
  WHERE NOT EXISTS (SELECT 1 FROM fence_updates AS c
                    WHERE c.state = 1 AND c.chat_id = j.value AND c.due_at > :now
                      AND (c.update_id, c.attempt, c.claim_id) NOT IN (
                            SELECT value ->> 0, value ->> 1, value ->> 2 FROM jsonb_each(:settle)))
    AND NOT EXISTS (SELECT 1 FROM fence_updates AS w INDEXED BY fence_updates_open_chat
                    WHERE w.state < 2 AND w.state = 0 AND w.chat_id = j.value AND w.update_id < u.update_id
                      AND w.due_at > :now)
  UNION ALL
  SELECT update_id, chat_id, attempt FROM fence_updates
  WHERE update_id IN (SELECT value FROM json_each(:chatless)) AND chat_id IS NULL
    AND state < 2 AND due_at <= :now)
"""
# SETTLE_MANY and TAKE in one statement (an exchange's round): the live claims :settle, [[update_id, attempt,
# claim_id], ...], settled, and the rows :chosen, [[update_id, claim_id], ...], claimed. HEADS, given the same
# :settle, counts the claims about to be settled as gone (their chats free). A row claimed here is never one settled
# here (it is not a live claim). Changes: the settled rows plus len(:chosen).
SETTLE_AND_TAKE = """
UPDATE fence_updates AS u SET
  state = CASE WHEN j.take THEN 1 ELSE 2 END,
  attempt = CASE WHEN j.take THEN u.attempt + 1 ELSE u.attempt END,
  claim_id = CASE WHEN j.take THEN j.claim_id ELSE u.claim_id END,
  due_at = CASE WHEN j.take THEN :until ELSE u.due_at END,
  changed_at = :now
FROM (SELECT 0 AS take, value ->> 0 AS update_id, value ->> 1 AS attempt, value ->> 2 AS claim_id
      FROM jsonb_each(:settle)
      UNION ALL
      SELECT 1, value ->> 0, NULL, value ->> 1 FROM jsonb_each(:chosen)) AS j
WHERE u.update_id = j.update_id
  AND (j.take OR (u.attempt = j.attempt AND u.claim_id = j.claim_id AND u.state = 1 AND u.due_at > :now))
"""
# Claim the chosen rows, [[update_id, claim_id], ...], in one statement.
TAKE = """
UPDATE fence_updates AS u SET state = 1, attempt = u.attempt + 1, claim_id = j.value ->> 1,
  due_at = :until, changed_at = :now
FROM jsonb_each(:chosen) AS j WHERE u.update_id = j.value ->> 0
"""
PAYLOADS = """
SELECT json_group_array(json_array(update_id, json(payload))) FROM fence_updates
WHERE update_id IN (SELECT value FROM json_each(:ids))
"""
# Updates whose payload Python cannot decode (too deep): exhaustions holding only {"update_id": ...} and :reason.
UNDECODABLE = """
UPDATE fence_updates SET state = 3, acknowledged = 0, changed_at = :now, error = :reason,
  payload = json_object('update_id', update_id)
WHERE update_id IN (SELECT value FROM json_each(:ids)) AND state < 2
"""
# Attempts spent: a pending row keeps the error of its last failure; a lapsed claim gets :reason.
EXHAUST_LAPSED = """
UPDATE fence_updates AS u SET state = 3, acknowledged = 0, changed_at = :now,
  error = CASE WHEN u.state = 0 AND u.error IS NOT NULL THEN u.error ELSE j.value ->> 1 END
FROM json_each(:lapsed) AS j WHERE u.update_id = j.value ->> 0
"""
LIVE = "state = 1 AND due_at > ?"
EXACT = "update_id = ? AND attempt = ? AND claim_id = ?"
OWNS = f"SELECT 1 FROM fence_updates WHERE {EXACT} AND {LIVE}"
SETTLE_OWNED = f"UPDATE fence_updates SET state = 2, changed_at = ? WHERE {EXACT} AND {LIVE}"
RETRY_OWNED = (
    f"UPDATE fence_updates SET state = 0, due_at = ?, error = ?, changed_at = ? WHERE {EXACT} AND {LIVE}"
)
EXHAUST_OWNED = (
    "UPDATE fence_updates SET state = 3, acknowledged = 0, error = ?, changed_at = ? "
    f"WHERE {EXACT} AND {LIVE}"
)
DUE_EXHAUSTIONS = (
    "SELECT update_id, attempt, claim_id, payload, chat_id, error, changed_at FROM fence_updates "
    "WHERE state = 3 AND acknowledged = 0 AND update_id > ? ORDER BY update_id LIMIT ?"
)
# An exhaustion the store made without a claim (an update it could not read or store) has no claim_id and is
# listed with claim_id "": that identity acknowledges it.
ACKNOWLEDGE = (
    "UPDATE fence_updates SET acknowledged = 1, changed_at = ? WHERE update_id = ? AND attempt = ? "
    "AND coalesce(claim_id, '') = ? AND state = 3 AND acknowledged = 0"
)
# An update the cursor has not passed (the webhook records without moving it) may still be delivered again by
# Telegram within its redelivery window: such a row is kept until it was recorded that long ago.
REDELIVERABLE = (
    "(update_id >= coalesce((SELECT value FROM fence_meta WHERE key = 'cursor'), 0) AND recorded_at > ?)"
)
PRUNE = (
    "DELETE FROM fence_updates WHERE state >= 2 AND changed_at < ? "
    f"AND (state IN (2, 4) OR (state = 3 AND acknowledged = 1)) AND NOT {REDELIVERABLE}"
)
# Every tagged live claim counted by owner tag (what a claim id holds before its first "-"); one owner's release.
LIVE_OWNER_COUNTS = (
    "SELECT substr(claim_id, 1, instr(claim_id, '-') - 1), count(*) FROM fence_updates "
    "WHERE state = 1 AND due_at > ? AND instr(claim_id, '-') > 1 GROUP BY 1"
)
RELEASE_OWNER = (
    "UPDATE fence_updates SET due_at = ?, changed_at = ? WHERE state = 1 AND due_at > ? AND substr(claim_id, 1, ?) = ?"
)
RELEASE_LEASE = f"UPDATE fence_updates SET due_at = ?, changed_at = ? WHERE {EXACT} AND {LIVE}"
UNCLAIM = (
    "UPDATE fence_updates SET state = 0, attempt = attempt - 1, due_at = ?, changed_at = ? "
    f"WHERE {EXACT} AND {LIVE}"
)
STATE_COUNTS = "SELECT state, acknowledged, count(*) FROM fence_updates GROUP BY state, acknowledged"
OLDEST_OPEN = "SELECT min(recorded_at) FROM fence_updates WHERE state < 2"
SETTLE_MANY = """
UPDATE fence_updates AS u SET state = 2, changed_at = :now FROM jsonb_each(:ids) AS j
WHERE u.update_id = j.value ->> 0 AND u.attempt = j.value ->> 1 AND u.claim_id = j.value ->> 2
  AND u.state = 1 AND u.due_at > :now
"""
RENEW_MANY = (
    "UPDATE fence_updates SET due_at = max(due_at, :until) "
    "WHERE state = 1 AND due_at > :now AND (update_id, attempt, claim_id) IN "
    "(SELECT value ->> 0, value ->> 1, value ->> 2 FROM json_each(:ids)) RETURNING update_id, attempt, claim_id"
)
BEGIN_GENERATION = (
    "INSERT INTO fence_generations(generation, pid, started_at) "
    "VALUES ((SELECT coalesce(max(generation), 0) + 1 FROM fence_generations), ?, ?) RETURNING generation"
)
PROGRESS = "UPDATE fence_generations SET progress_at = ? WHERE generation = ?"
# The latest generation begun by the webhook door (a poller's generations are not noted): what ``status`` reads
# to tell which door a generation is, and so what its progress means (getUpdates answers, or deliveries).
NOTE_WEBHOOK_GENERATION = (
    "INSERT INTO fence_meta(key, value) VALUES ('webhook_generation', ?) "
    "ON CONFLICT(key) DO UPDATE SET value = excluded.value"
)
READ_WEBHOOK_GENERATION = "SELECT value FROM fence_meta WHERE key = 'webhook_generation'"
END_GENERATION = (
    "UPDATE fence_generations SET ended_at = ?, end_reason = ? WHERE generation = ? AND ended_at IS NULL"
)
LATEST_GENERATION = (
    "SELECT generation, pid, started_at, progress_at, ended_at, end_reason FROM fence_generations "
    "ORDER BY generation DESC LIMIT 1"
)
