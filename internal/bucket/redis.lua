-- Ration token bucket: one decision, atomically, on the server's clock.
-- The arithmetic is the Go reference model's (model.go), operation for
-- operation, so results are bit-identical; keep the two in step.
--
-- KEYS[1]  the bucket: a string of 24 bytes, struct.pack('<ddd', tokens,
--          last, exp): the tokens left, last (µs on the server's clock, a
--          whole number) and exp (µs: the key's TTL does not end before it;
--          0 when it has none), each a little-endian IEEE 754 double, so a
--          value is stored and replied exactly as computed, with no decimal
--          formatting or parsing. A bucket an earlier version kept as a hash
--          {tokens, last} (decimal strings) is read as one and rewritten in
--          this form. While held takes hold something (model.go, take),
--          40 bytes: '<ddddd' tokens, last, exp, held, held until (µs);
--          tokens then refill to burst - held only, until held until.
-- KEYS[2]  optional request-id record (same slot): a hash {decision, refunded}
-- ARGV     op ("take" | "refund"), burst, rate, cost, the bucket's TTL (ms,
--          twice its least lifetime: see Expiry below) when last = now ("0":
--          none), request-id TTL (ms), held for (µs: a held take, which has
--          no request id and "0" as request-id TTL)
--
-- takes    KEYS[1..n] buckets (one server: a batch never goes to a Cluster
--          this way), ARGV "takes" then burst, rate, cost, TTL for each key
--          in turn: n takes in order, on one reading of the clock, each
--          exactly what "take" would decide (the same function below), for
--          the cost of one script call instead of n. Replies now (8 bytes,
--          '<d') then, per key, its allowed ('0' | '1') and its stored
--          bucket (24 bytes, tokens first): 8 + 25n bytes. A key holding
--          something other than a bucket fails only its own decision: 'e'
--          then '<ddd' of its length in bytes (-1: another type), 0, 0, and
--          the key is left as it was, so that one foreign key does not
--          fail a batch's decisions on other keys; a take answers such a
--          key with an error. A bucket that holds something is replied as
--          its first 24 bytes (tokens, last, exp), here and to a take.
--
-- take   replies allowed ('0' | '1') then the stored bucket (24 bytes), now
--        being the bucket's last; when the clock stepped back (last is
--        ahead of now) now follows (8 bytes, '<d'). Retry and reset follow
--        from tokens, burst, rate and cost by the model's own operations,
--        which the caller repeats (redis.go). With a request id it records,
--        and replies, "<allowed> <tokens> <retry s> <reset s> <now µs>
--        <replayed 0|1>" (floats %.17g) instead: a replay answers with the
--        decision as it was made, whatever the rule's shape is now, and
--        agents of earlier versions read the same records.
-- refund replies "<refunded 0|1> <now µs>"
--
-- Cost (docs/performance.md): the redis.calls (TIME, GET, SET) are most of
-- the script's work inside Redis; next came decimal conversions, tonumber
-- (a C strtod, run twice by tonumber) and string.format (a C sprintf, 2k
-- instructions for %d, 4.3k for %.17g), which the binary bucket does
-- without, and setting a TTL (see Expiry), which most writes skip. Numbers
-- in ARGV are read by arithmetic (one strtod), and the bucket's TTL in the
-- usual case comes from the caller, which formats it once per rule
-- (redis.go).
--
-- Needs Redis >= 6.0 (SET KEEPTTL). TIME before writes relies on effects
-- replication, the default since 5.0 (and the only mode since 7.0), so
-- there is no redis.replicate_commands() call.
--
-- Redis keeps the writes a script made before an error. So the writes are
-- ordered to fail safe: a take charges the bucket before it records the
-- request id (a lost record can only charge twice), and a refund by id marks
-- the record refunded before it credits (a lost credit only under-refunds).
local fmt = string.format
local pack, unpack = struct.pack, struct.unpack
local op = ARGV[1]

-- now in µs: TIME's seconds and microseconds, whole numbers well below 2^53,
-- so exact.
local tm = redis.call('TIME')
local now = tm[1] * 1000000 + tm[2]

local takes = op == 'takes'
local take = takes or op == 'take'
if not take and op ~= 'refund' then
  return error('unknown operation ' .. tostring(op) .. ': want take, takes or refund')
end
local rkey, heldFor
if not takes then
  rkey = KEYS[2]
  if ARGV[7] then heldFor = ARGV[7] * 1 end
end

if rkey then
  local rec = redis.call('HMGET', rkey, 'decision', 'refunded')
  if take then
    if rec[1] then return rec[1] .. ' 1' end
  else
    -- refund by id: only an allowed decision, and only once
    if not rec[1] or string.sub(rec[1], 1, 1) ~= '1' or rec[2] then
      return fmt('0 %d', now)
    end
    redis.call('HSET', rkey, 'refunded', '1')
  end
end

-- One decision per key: one for a take or a refund, #KEYS for takes, whose
-- arguments for key i start where a take's do for key 1 (ARGV[4i-2]). A
-- loop rather than a function called per key: a closure is made on every
-- run of the script, which costs more than the loop.
local n, out, number = 1, nil, nil
if takes then
  -- A batch repeats few numbers (its rules' bursts, rates and costs,
  -- nearly always 1): each distinct one is read once.
  n, out = #KEYS, {pack('<d', now)}
  local seen = {}
  number = function(a)
    local v = seen[a]
    if v == nil then
      v = a * 1
      seen[a] = v
    end
    return v
  end
end
local allowed, s, tokens, last, burst, rate, cost
for i = 1, n do
  local key, j = KEYS[i], 4 * i - 2
  -- x * 1 reads a decimal argument with one strtod (tonumber runs two)
  -- and keeps its bits, -0 included.
  if number then
    burst, rate, cost = number(ARGV[j]), number(ARGV[j + 1]), number(ARGV[j + 2])
  else
    burst, rate, cost = ARGV[j] * 1, ARGV[j + 1] * 1, ARGV[j + 2] * 1
  end

  local exp, bad
  local held, hu = 0, 0
  tokens, last = nil, nil
  local v = redis.pcall('GET', key)
  if v then
    if #v == 24 then
      tokens, last, exp = unpack('<ddd', v)
    elseif #v == 40 then
      tokens, last, exp, held, hu = unpack('<ddddd', v)
    elseif v.err then
      -- not a string (pcall's error reply, a table): a bucket of an earlier
      -- version, or another type, which HMGET refuses with WRONGTYPE
      local st
      if takes then
        st = redis.pcall('HMGET', key, 'tokens', 'last')
        if st.err then bad = -1 end
      else
        st = redis.call('HMGET', key, 'tokens', 'last')
      end
      if not bad and st[1] and st[2] then tokens, last = tonumber(st[1]), tonumber(st[2]) end
    elseif takes then
      bad = #v
    else
      return error('bucket ' .. key .. ' holds ' .. #v .. ' bytes, not a Ration token bucket (24 or 40)')
    end
  end

  -- A refund that finds no bucket has nothing to do: a missing bucket is
  -- full, with nothing to give back and nothing to write.
  if not bad and (take or tokens) then
    -- cap: what the bucket refills to, burst less what is held (model.go
    -- heldCap; burst - 0 is burst exactly)
    local cap
    if tokens then
      if held ~= 0 and now >= hu then
        -- the hold ends by now: refill up to its end under it, then on
        if hu > last then
          tokens = tokens + rate * (hu - last) / 1e6
          cap = burst - held
          if cap < 0 then cap = 0 end
          if tokens > cap then tokens = cap end
          last = hu
        end
        held, hu = 0, 0
      end
      local elapsed = now - last
      if elapsed < 0 then elapsed = 0 end
      tokens = tokens + rate * elapsed / 1e6
      cap = burst - held
      if cap < 0 then cap = 0 end
      if tokens > cap then tokens = cap end
      if now > last then last = now end
    else
      tokens, last = burst, now
    end

    allowed = '0'
    if take then
      if tokens >= cost then
        tokens = tokens - cost
        allowed = '1'
        if heldFor and heldFor > 0 then
          held = held + cost
          if last + heldFor > hu then hu = last + heldFor end
        end
      end
    else
      tokens = tokens + cost
      if tokens > cap then tokens = cap end
    end

    -- Expiry (model.go expiresAfter): not before the bucket would be full
    -- again, t = B/r from last plus a one second margin; rate 0, or a refill
    -- longer than 2^50 µs, keeps the bucket forever (SET without PX drops
    -- any TTL). The key is given 2t, and exp, a time before which that TTL
    -- cannot end, rides in the value: a write whose t still fits before exp
    -- keeps the TTL (SET KEEPTTL), which costs some 5k instructions less
    -- than setting one (Redis 7 also rewrites PX into PXAT to propagate
    -- it). So a key lives from t to 2t past its last write, and is given a
    -- TTL about once per t, not once per decision. With last = now the
    -- caller passed 2t in ms (ARGV[j + 3], the same arithmetic in Go);
    -- last ahead of now (the clock stepped back) is computed here.
    -- A bucket holding something is full no earlier than B/r after its
    -- hold ends: t counts from there (model.go expiresAfter).
    local ttl = ARGV[j + 3]
    if last ~= now or held ~= 0 then
      local from = last
      if held ~= 0 and hu > from then from = hu end
      ttl = '0'
      local full = 0
      if rate > 0 then full = math.ceil(burst / rate * 1e6) end
      if full > 0 and full < 1125899906842624 then
        local t = full + (from - now) + 1000000
        if t < 1125899906842624 then ttl = fmt('%d', math.ceil(t / 500)) end
      end
    end
    local px
    if ttl == '0' then
      exp = 0
    else
      -- span is 2t rounded up to whole ms, so span / 2 >= t. Redis counts a
      -- TTL from its own clock, read after TIME (at most 999 µs short of
      -- now once truncated to ms): a PX of span ends after now - 1000 + span.
      local span = ttl * 1000
      if not (exp and exp >= now + span / 2 and exp <= now + span) then
        exp, px = now - 1000 + span, ttl
      end
    end
    if held ~= 0 then
      s = pack('<ddddd', tokens, last, exp, held, hu)
    else
      s = pack('<ddd', tokens, last, exp)
    end
    if ttl == '0' then
      redis.call('SET', key, s)
    elseif px then
      redis.call('SET', key, s, 'PX', px)
    else
      redis.call('SET', key, s, 'KEEPTTL')
    end
    if held ~= 0 then s = string.sub(s, 1, 24) end
  end
  if out then
    if bad then
      out[2 * i] = 'e'
      out[2 * i + 1] = pack('<ddd', bad, 0, 0)
    else
      out[2 * i] = allowed
      out[2 * i + 1] = s
    end
  end
end

if takes then return table.concat(out) end
if not take then return fmt('1 %d', now) end
if not rkey then
  if last == now then return allowed .. s end
  return allowed .. s .. pack('<d', now)
end

-- With a request id: the whole decision, as the model makes it (model.go
-- take), recorded for replays.
local retry, reset = 0, 0
if rate > 0 then
  if allowed == '0' then retry = (cost - tokens) / rate end
  reset = (burst - tokens) / rate
end
local reply = fmt('%s %.17g %.17g %.17g %d', allowed, tokens, retry, reset, now)
redis.call('HSET', rkey, 'decision', reply)
redis.call('PEXPIRE', rkey, ARGV[6])
return reply .. ' 0'
