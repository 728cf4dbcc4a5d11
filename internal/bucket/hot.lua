-- Ration hot-key bucket (a rule in mode auto): the token bucket of redis.lua,
-- plus a decision-rate estimate and a lease mark. The Go reference model is
-- hot.go (HotTake, HotMark, HotRefund); tokens are computed operation for
-- operation as in model.go, so they are bit-identical; keep them in step.
--
-- KEYS[1]  the bucket: a hash {tokens, last, lu, ep, hr, ht, calm, hd, hu}
--          lu    leased until (µs, server clock), only while promoted
--          ep    the latest promotion's epoch (µs at promotion, increasing)
--          hr,ht decisions per second across every agent, as of ht (µs)
--          calm  no promotion before (µs), set when a mark lapses
--          hd,hu what held takes hold, until hu (µs): tokens refill to
--                burst - hd only until then (model.go, take); only while
--                something is held
-- ARGV     take:   "take",   burst, rate, cost, promote_above, hold µs, tau µs
--                  [, held for µs: a held take]
--          mark:   "mark",   burst, rate, epoch, count, hold µs, tau µs, demote_below
--          refund: "refund", burst, rate, cost
--
-- take   replies "L <epoch> <for µs> <now µs>" while the key is promoted
--        (nothing decided: spend the lease of that epoch), else
--        "<allowed 0|1> <tokens> <now µs>", and when this decision promoted
--        the key "<allowed> <tokens> <now µs> <epoch> <for µs>".
-- mark   replies "K <for µs> <now µs>" (extended), "C <for µs> <now µs>" (the
--        key has cooled: not extended) or "G 0 <now µs>" (that promotion is
--        over).
-- refund replies "1 <now µs>"; a promoted bucket is left alone.
--
-- A mark never shortens lu, and while lu is ahead no take decides: that is
-- the whole hand-over between the bucket and the leases. A take that finds
-- lu passed resumes the bucket empty as of lu.
local fmt = string.format
local key = KEYS[1]
local op = ARGV[1]
local burst, rate = tonumber(ARGV[2]), tonumber(ARGV[3])

local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000000 + tonumber(tm[2])
local ns = fmt('%d', now)

local st = redis.call('HMGET', key, 'tokens', 'last', 'lu', 'ep', 'hr', 'ht', 'calm', 'hd', 'hu')
local exists = st[1] and st[2]
local lu, ep = tonumber(st[3]), tonumber(st[4]) or 0
local hr, ht, calm = tonumber(st[5]) or 0, tonumber(st[6]) or 0, tonumber(st[7]) or 0
local held, hu = tonumber(st[8]) or 0, tonumber(st[9]) or 0

-- expire as hot.go hotExpiresAfter: never before the mark can be read, nor
-- before the bucket is full after its hold ends
local function expire(last)
  local full = 0
  if rate > 0 then full = math.ceil(burst / rate * 1e6) end
  if full > 0 and full < 1125899906842624 then
    local from = last
    if held ~= 0 and hu > from then from = hu end
    local ttl = full + (from - now) + 1000000
    if lu then
      local t = lu - now + full + 1000000
      if t > ttl then ttl = t end
    end
    if ttl < 1125899906842624 then
      redis.call('PEXPIRE', key, fmt('%d', math.ceil(ttl / 1000)))
      return
    end
  end
  redis.call('PERSIST', key)
end

-- refill brings tokens (as of last) to now as model.go refill: a hold
-- that ends by now is two steps, capped at burst - held up to its end.
local function refill(tokens, last)
  local cap
  if held ~= 0 and now >= hu then
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
  return tokens, last, cap
end

-- the hold fields as written: set while something is held, else deleted
-- if the key had them
local function writeHeld()
  if held ~= 0 then
    redis.call('HSET', key, 'hd', fmt('%.17g', held), 'hu', fmt('%d', hu))
  elseif st[8] then
    redis.call('HDEL', key, 'hd', 'hu')
  end
end

local function count(n, tau)
  local elapsed = now - ht
  if elapsed < 0 then elapsed = 0 end
  hr = hr * math.exp(-elapsed / tau) + n * 1e6 / tau
  if now > ht then ht = now end
end

if op == 'mark' then
  local epoch, n = tonumber(ARGV[4]), tonumber(ARGV[5])
  local hold, tau, demote = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
  if not exists or not lu or ep ~= epoch or now >= lu then
    return 'G 0 ' .. ns
  end
  count(n, tau)
  local verdict = 'C'
  if hr >= demote then
    verdict = 'K'
    if now + hold > lu then lu = now + hold end
  end
  redis.call('HSET', key, 'lu', fmt('%d', lu), 'hr', fmt('%.17g', hr), 'ht', fmt('%d', ht))
  expire(tonumber(st[2]))
  return verdict .. ' ' .. fmt('%d', lu - now) .. ' ' .. ns
end

if op == 'refund' then
  if not exists or lu then return '1 ' .. ns end
  local tokens, last, cap = refill(tonumber(st[1]), tonumber(st[2]))
  tokens = tokens + tonumber(ARGV[4])
  if tokens > cap then tokens = cap end
  redis.call('HSET', key, 'tokens', fmt('%.17g', tokens), 'last', fmt('%d', last))
  writeHeld()
  expire(last)
  return '1 ' .. ns
end

-- take
local cost, promote = tonumber(ARGV[4]), tonumber(ARGV[5])
local hold, tau = tonumber(ARGV[6]), tonumber(ARGV[7])
local heldFor = tonumber(ARGV[8]) or 0
local tokens, last
if exists then
  tokens, last = tonumber(st[1]), tonumber(st[2])
  if lu then
    if now < lu then
      return 'L ' .. fmt('%d', ep) .. ' ' .. fmt('%d', lu - now) .. ' ' .. ns
    end
    -- the mark lapsed: resume empty as of its end (what is held stays
    -- held)
    tokens = 0
    if lu > last then last = lu end
    calm = lu + hold
    lu = nil
    redis.call('HDEL', key, 'lu')
  end
  tokens, last = refill(tokens, last)
else
  tokens, last = burst, now
  ep, hr, ht, calm = 0, 0, now, 0
end

local allowed = '0'
if tokens >= cost then
  tokens = tokens - cost
  allowed = '1'
  if heldFor > 0 then
    held = held + cost
    if last + heldFor > hu then hu = last + heldFor end
  end
end
count(1, tau)

local ts = fmt('%.17g', tokens)
local promoted = ''
if hr >= promote and now >= calm then
  ep = ep + 1
  if now > ep then ep = now end
  lu = now + hold
  promoted = ' ' .. fmt('%d', ep) .. ' ' .. fmt('%d', hold)
  redis.call('HSET', key, 'tokens', ts, 'last', fmt('%d', last), 'hr', fmt('%.17g', hr), 'ht', fmt('%d', ht),
    'calm', fmt('%d', calm), 'lu', fmt('%d', lu), 'ep', fmt('%d', ep))
else
  redis.call('HSET', key, 'tokens', ts, 'last', fmt('%d', last), 'hr', fmt('%.17g', hr), 'ht', fmt('%d', ht),
    'calm', fmt('%d', calm))
end
writeHeld()
expire(last)
return allowed .. ' ' .. ts .. ' ' .. ns .. promoted
