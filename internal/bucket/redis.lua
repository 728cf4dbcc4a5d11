-- Ration token bucket: one decision, atomically, on the server's clock.
-- The arithmetic is the Go reference model's (model.go), operation for
-- operation, so results are bit-identical; keep the two in step.
--
-- KEYS[1]  the bucket: a hash {tokens (%.17g), last (µs, integer)}
-- KEYS[2]  optional request-id record (same slot): a hash {decision, refunded}
-- ARGV     op ("take" | "refund"), burst, rate, cost, the bucket's TTL (ms)
--          when last = now ("0": none), request-id TTL (ms)
--
-- takes    KEYS[1..n] buckets (one server: a batch never goes to a Cluster
--          this way), ARGV "takes" then burst, rate, cost, TTL for each key
--          in turn: n takes in order, on one reading of the clock, each
--          exactly what "take" would decide (the same function below), for
--          the cost of one script call instead of n. Replies
--          "<now µs> <allowed 1> <tokens 1> ... <allowed n> <tokens n>".
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
-- (docs/performance.md); next come tonumber (a C strtod, about 1.6k
-- instructions each) and string.format (a C sprintf, 2k for %d, 4.3k for
-- %.17g). So each value is formatted once and reused (the stored tokens are
-- the replied tokens), now and last are written as TIME gave them rather
-- than formatted, a whole number of tokens is formatted with %d (the same
-- digits %.17g writes), and the bucket's TTL in the usual case comes from
-- the caller, which formats it once per rule (redis.go).
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
local op = ARGV[1]

-- now in µs, as a string (ns) and a number: TIME's seconds and its
-- microseconds padded to six digits, so one strtod and no sprintf.
local tm = redis.call('TIME')
local us = tm[2]
if #us < 6 then us = string.sub('00000' .. us, -6) end
local ns = tm[1] .. us
local now = tonumber(ns)

-- decide refills the bucket at key, takes (or refunds) cost, writes it back
-- with its expiry and returns the decision ('0' or '1') and the tokens left
-- as stored (a string), or nothing when a refund found no bucket (a missing
-- bucket is full: nothing to give back, nothing to write). ttl is the
-- caller's TTL for last = now (ARGV[5] of a take).
local function decide(key, take, burst, rate, cost, ttl)
  local st = redis.call('HMGET', key, 'tokens', 'last')
  local exists = st[1] and st[2]
  if not take and not exists then return end

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
  if take then
    if tokens >= cost then
      tokens = tokens - cost
      allowed = '1'
    end
  else
    tokens = tokens + cost
    if tokens > burst then tokens = burst end
  end

  -- %d writes a whole number below 10^15 with the digits %.17g would, at
  -- half the cost; -0 (which %d would write as 0) keeps %.17g.
  local ts
  if tokens % 1 == 0 and tokens < 1e15 and (tokens ~= 0 or 1 / tokens > 0) then
    ts = fmt('%d', tokens)
  else
    ts = fmt('%.17g', tokens)
  end
  local ls = ns
  if last ~= now then ls = fmt('%d', last) end
  redis.call('HSET', key, 'tokens', ts, 'last', ls)

  -- Expiry (model.go expiresAfter): only once the bucket would be full
  -- again, B/r from last plus a one second margin; rate 0, or a refill
  -- longer than 2^50 µs, keeps the bucket forever. With last = now the
  -- caller passed it (the same arithmetic in Go); last ahead of now (the
  -- clock stepped back) is computed here.
  if last ~= now then
    ttl = '0'
    local full = 0
    if rate > 0 then full = math.ceil(burst / rate * 1e6) end
    if full > 0 and full < 1125899906842624 then
      local t = full + (last - now) + 1000000
      if t < 1125899906842624 then ttl = fmt('%d', math.ceil(t / 1000)) end
    end
  end
  if ttl ~= '0' then
    redis.call('PEXPIRE', key, ttl)
  else
    redis.call('PERSIST', key)
  end
  return allowed, ts, tokens
end

if op == 'takes' then
  -- A batch repeats few numbers (its rules' bursts, rates and TTLs, costs
  -- nearly always 1): each distinct one is read once.
  local num = {}
  local function number(s)
    local v = num[s]
    if v == nil then
      v = tonumber(s)
      num[s] = v
    end
    return v
  end
  local out = {ns}
  for i = 1, #KEYS do
    local j = 4 * i - 2
    local allowed, ts = decide(KEYS[i], true, number(ARGV[j]), number(ARGV[j + 1]), number(ARGV[j + 2]), ARGV[j + 3])
    out[2 * i] = allowed
    out[2 * i + 1] = ts
  end
  return table.concat(out, ' ')
end

local key, rkey = KEYS[1], KEYS[2]
local burst, rate, cost = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])

if rkey then
  local rec = redis.call('HMGET', rkey, 'decision', 'refunded')
  if op == 'take' then
    if rec[1] then return rec[1] .. ' 1' end
  else
    -- refund by id: only an allowed decision, and only once
    if not rec[1] or string.sub(rec[1], 1, 1) ~= '1' or rec[2] then
      return '0 ' .. ns
    end
    redis.call('HSET', rkey, 'refunded', '1')
  end
end

local allowed, ts, tokens = decide(key, op == 'take', burst, rate, cost, ARGV[5])
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
redis.call('PEXPIRE', rkey, ARGV[6])
return reply .. ' 0'
