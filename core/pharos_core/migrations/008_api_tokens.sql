-- kind: idempotent (every statement is IF NOT EXISTS)
-- API tokens (pharos_api.auth; docs/security.md). A token is "pht_<token_id>_<secret>", the
-- secret 32 random bytes (URL-safe base64); only a salted SHA-256 of the secret is stored
-- (token_hash = sha256(salt || secret), hex; salt 16 random bytes, hex), never the token.
-- role: admin | operator | user | scheduler; user: the name a 'user' token sees the jobs of
-- (job_events.user). The newest row per token_id is the truth (read with FINAL): revoking
-- inserts the same row with revoked = 1 and a newer updated.
CREATE TABLE IF NOT EXISTS api_tokens
(
    token_id     String,
    role         LowCardinality(String),
    user         String,
    description  String,
    salt         String,
    token_hash   String,
    created      DateTime64(9, 'UTC'),
    revoked      UInt8,
    updated      DateTime64(9, 'UTC')
)
ENGINE = ReplacingMergeTree(updated)
ORDER BY token_id;
