-- Ration token bucket: one decision, atomically, on the server's clock.
-- The arithmetic is the Go reference model's (model.go), operation for
-- operation, so results are bit-identical; keep the two in step.
--
-- KEYS[1]  the bucket: a hash {tokens (%.17g), last (µs, integer)}
-- KEYS[2]  optional request-id record (same slot): a hash {decision, refunded}
-- ARGV     op ("take" | "refund"), burst, rate, cost, request-id TTL (ms)
--
-- take   replies "<allowed 0|1> <tokens> <retry s> <reset s> <now µs> <replayed 0|1>"
-- refund replies "<refunded 0|1> <now µs>"
--
-- Needs Redis >= 5: TIME before writes relies on effects replication, the
-- default since 5.0 (and the only mode since 7.0), so there is no
-- redis.replicate_commands() call.
--
-- Redis keeps the writes a script made before an error. So the writes are
-- ordered to fail safe: a take charges the bucket before it records the
-- request id (a lost record can only charge twice), and a refund by id marks
-- the record refunded before it credits (a lost credit only under-refunds).
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
      return '0 ' .. string.format('%d', now)
    end
    redis.call('HSET', rkey, 'refunded', '1')
  end
end

local st = redis.call('HMGET', key, 'tokens', 'last')
local exists = st[1] and st[2]
if op == 'refund' and not exists then
  -- a missing bucket is full: nothing to give back, nothing to write
  return '1 ' .. string.format('%d', now)
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

local reply
if op == 'take' then
  local allowed, retry, reset = 0, 0, 0
  if tokens >= cost then
    tokens = tokens - cost
    allowed = 1
  elseif rate > 0 then
    retry = (cost - tokens) / rate
  end
  if rate > 0 then reset = (burst - tokens) / rate end
  reply = string.format('%d %.17g %.17g %.17g %d', allowed, tokens, retry, reset, now)
else
  tokens = tokens + cost
  if tokens > burst then tokens = burst end
  reply = '1 ' .. string.format('%d', now)
end

redis.call('HSET', key, 'tokens', string.format('%.17g', tokens), 'last', string.format('%d', last))

-- Expiry (model.go expiresAfter): only once the bucket would be full again,
-- B/r from last plus a one second margin; rate 0, or a refill longer than
-- 2^50 µs, keeps the bucket forever.
local full = 0
if rate > 0 then full = math.ceil(burst / rate * 1e6) end
if full > 0 and full < 1125899906842624 then
  local ttl = full + (last - now) + 1000000
  if ttl < 1125899906842624 then
    redis.call('PEXPIRE', key, string.format('%d', math.ceil(ttl / 1000)))
  else
    redis.call('PERSIST', key)
  end
else
  redis.call('PERSIST', key)
end

if op == 'take' then
  if rkey then
    redis.call('HSET', rkey, 'decision', reply)
    redis.call('PEXPIRE', rkey, ARGV[5])
  end
  return reply .. ' 0'
end
return reply
