-- Ration token bucket: one decision, atomically, on the server's clock.
-- The arithmetic is the Go reference model's (model.go), operation for
-- operation, so results are bit-identical; keep the two in step.
--
-- KEYS[1]  the bucket: a hash {tokens (%.17g), last (µs, integer)}
-- KEYS[2]  optional request-id record (same slot): a hash {decision, refunded}
-- ARGV     op ("take" | "refund"), burst, rate, cost, request-id TTL (ms)
--
-- take   replies "<allowed 0|1> <tokens> <now µs>": retry and reset follow
--        from tokens, burst, rate and cost by the model's own operations,
--        which the caller repeats (redis.go), so the script formats one
--        float, not three. With a request id it records, and replies,
--        "<allowed> <tokens> <retry s> <reset s> <now µs> <replayed 0|1>"
--        (floats %.17g): a replay answers with the decision as it was made,
--        whatever the rule's shape is now, and agents of earlier versions
--        read the same records.
-- refund replies "<refunded 0|1> <now µs>"
--
-- Cost: TIME, HMGET, HSET and PEXPIRE are the script's work inside Redis
-- (docs/performance.md); every string.format is a C sprintf, so each value
-- is formatted once and reused (the stored tokens are the replied tokens).
--
-- Needs Redis >= 5: TIME before writes relies on effects replication, the
-- default since 5.0 (and the only mode since 7.0), so there is no
-- redis.replicate_commands() call.
--
-- Redis keeps the writes a script made before an error. So the writes are
-- ordered to fail safe: a take charges the bucket before it records the
-- request id (a lost record can only charge twice), and a refund by id marks
-- the record refunded before it credits (a lost credit only under-refunds).
local fmt = string.format
local key, rkey = KEYS[1], KEYS[2]
local op = ARGV[1]
local burst, rate, cost = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])

local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000000 + tonumber(tm[2])

if rkey then
  local rec = redis.call('HMGET', rkey, 'decision', 'refunded')
  if op == 'take' then
    if rec[1] then return rec[1] .. ' 1' end
  else
    -- refund by id: only an allowed decision, and only once
    if not rec[1] or string.sub(rec[1], 1, 1) ~= '1' or rec[2] then
      return '0 ' .. fmt('%d', now)
    end
    redis.call('HSET', rkey, 'refunded', '1')
  end
end

local st = redis.call('HMGET', key, 'tokens', 'last')
local exists = st[1] and st[2]
if op == 'refund' and not exists then
  -- a missing bucket is full: nothing to give back, nothing to write
  return '1 ' .. fmt('%d', now)
end

local tokens, last
if exists then
  tokens, last = tonumber(st[1]), tonumber(st[2])
  local elapsed = now - last
  if elapsed < 0 then elapsed = 0 end
  tokens = tokens + rate * elapsed / 1e6
  if tokens > burst then tokens = burst end
  if now > last then last = now end
else
  tokens, last = burst, now
end

local allowed = '0'
if op == 'take' then
  if tokens >= cost then
    tokens = tokens - cost
    allowed = '1'
  end
else
  tokens = tokens + cost
  if tokens > burst then tokens = burst end
end

local ts, ls = fmt('%.17g', tokens), fmt('%d', last)
local ns = ls
if last ~= now then ns = fmt('%d', now) end
redis.call('HSET', key, 'tokens', ts, 'last', ls)

-- Expiry (model.go expiresAfter): only once the bucket would be full again,
-- B/r from last plus a one second margin; rate 0, or a refill longer than
-- 2^50 µs, keeps the bucket forever.
local full = 0
if rate > 0 then full = math.ceil(burst / rate * 1e6) end
if full > 0 and full < 1125899906842624 then
  local ttl = full + (last - now) + 1000000
  if ttl < 1125899906842624 then
    redis.call('PEXPIRE', key, fmt('%d', math.ceil(ttl / 1000)))
  else
    redis.call('PERSIST', key)
  end
else
  redis.call('PERSIST', key)
end

if op ~= 'take' then return '1 ' .. ns end
if not rkey then return allowed .. ' ' .. ts .. ' ' .. ns end

-- With a request id: the whole decision, as the model makes it (model.go
-- take), recorded for replays.
local retry, reset = 0, 0
if rate > 0 then
  if allowed == '0' then retry = (cost - tokens) / rate end
  reset = (burst - tokens) / rate
end
local reply = fmt('%s %s %.17g %.17g %s', allowed, ts, retry, reset, ns)
redis.call('HSET', rkey, 'decision', reply)
redis.call('PEXPIRE', rkey, ARGV[5])
return reply .. ' 0'
