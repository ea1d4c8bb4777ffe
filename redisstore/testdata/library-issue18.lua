#!lua name=floodgate_v1
local apply, batch, move
local function init()
-- lua/00_header.lua
-- Floodgate's decision script for Redis. It is the same integer math as
-- internal/algo in Go, on Lua numbers (doubles, exact to 2^53; every state
-- word and intermediate value stays below 2^53, and products that could not
-- are done by muldiv). Assembled from the files of redisstore/lua in name
-- order: helpers, one file per algorithm, then the dispatcher.

local floor = math.floor
local ceil = math.ceil
local max = math.max
local min = math.min

-- ceil(a/b) for b > 0; 0 for a <= 0. Exact: for integers below 2^53 the
-- rounded quotient never crosses an integer.
local function ceildiv(a, b)
  if a <= 0 then return 0 end
  return ceil(a / b)
end

local function floordiv(a, b)
  return floor(a / b)
end

-- floor(a*b/c) for a, b >= 0, c > 0, exact even when a*b passes 2^53:
-- schoolbook doubling over a's bits, keeping every value below 2^53.
local function muldiv(a, b, c)
  local p = a * b
  if p < 9007199254740992 then return floor(p / c) end
  local q, r = floor(b / c), b % c -- b = q*c + r
  -- a*b/c = a*q + a*r/c
  local hi = a * q
  local qa, ra = 0, 0
  local bits = {}
  local x = a
  while x > 0 do
    bits[#bits + 1] = x % 2
    x = floor(x / 2)
  end
  for i = #bits, 1, -1 do
    qa, ra = qa * 2, ra * 2
    if ra >= c then qa, ra = qa + 1, ra - c end
    if bits[i] == 1 then
      ra = ra + r
      if ra >= c then qa, ra = qa + 1, ra - c end
    end
  end
  return hi + qa, ra
end

-- ceil(a*b/c), exact.
local function muldivceil(a, b, c)
  local q, r = muldiv(a, b, c)
  if r == nil then
    local p = a * b
    if p % c ~= 0 then return q + 1 end
    return q
  end
  if r > 0 then return q + 1 end
  return q
end

-- lua/05_kinds.lua
-- Algorithm numbers, as internal/algo.Kind.
local K_TOKEN, K_INTERVAL, K_METER, K_SHAPER, K_GCRA = 1, 2, 3, 4, 5
local K_FIXED, K_LOG, K_COUNTER, K_SUB = 6, 7, 8, 9

-- lua/10_bucket.lua
-- Bucket algorithms: token bucket, leaky meter, GCRA (identical), and the
-- leaky shaper. State {level, last}: level is consumed capacity in units
-- (Unit per request), draining Rate units per microsecond since last.
local bucket = {}

function bucket.advance(p, s, now)
  if now < s[2] then now = s[2] end
  if s[1] > 0 then
    if now - s[2] >= ceildiv(s[1], p.rate) then
      s[1] = 0
    else
      s[1] = s[1] - (now - s[2]) * p.rate
    end
  end
  s[2] = now
  return now
end

function bucket.used(p, s, now) return ceildiv(s[1], p.unit) end

function bucket.fits(p, s, now, cost, ceiling)
  if p.kind == K_SHAPER and cost ~= 0 and s[1] ~= 0 then return false end
  return s[1] + cost * p.unit <= ceiling * p.unit
end

function bucket.commit(p, s, now, cost) s[1] = s[1] + cost * p.unit end

function bucket.clamp(p, s, now) s[1] = min(s[1], p.maxceil * p.unit) end

function bucket.refund(p, s, now, cost)
  if cost >= ceildiv(s[1], p.unit) then s[1] = 0 else s[1] = s[1] - cost * p.unit end
end

function bucket.remaining(p, s, now)
  local r = (p.burst * p.unit - s[1]) / p.unit
  if r < 0 then return 0 end
  return floor(r)
end

function bucket.reset(p, s, now) return ceildiv(s[1], p.rate) end

function bucket.retry(p, s, now, cost, ceiling)
  if bucket.fits(p, s, now, cost, ceiling) then return 0 end
  if p.kind == K_SHAPER and cost ~= 0 then return ceildiv(s[1], p.rate) end
  return ceildiv(s[1] - (ceiling - cost) * p.unit, p.rate)
end

-- lua/20_interval.lua
-- Token bucket with interval refill. State {used, anchor}: Limit tokens come
-- back at anchor+P, anchor+2P, ..., the anchor set when a full bucket is
-- first drawn on.
local interval = {}

function interval.advance(p, s, now)
  if s[1] > 0 then
    if now < s[2] then now = s[2] end
    local d = now - s[2]
    if d >= p.period then
      local k = floordiv(d, p.period)
      if k >= ceildiv(s[1], p.limit) then
        s[1] = 0
      else
        s[1] = s[1] - k * p.limit
        s[2] = s[2] + k * p.period
      end
    end
  end
  return now
end

function interval.used(p, s, now) return s[1] end
function interval.fits(p, s, now, cost, ceiling) return s[1] + cost <= ceiling end

function interval.commit(p, s, now, cost)
  if s[1] == 0 then s[2] = now end
  s[1] = s[1] + cost
end

function interval.clamp(p, s, now) s[1] = min(s[1], p.maxceil) end
function interval.refund(p, s, now, cost) s[1] = max(0, s[1] - cost) end
function interval.remaining(p, s, now) return max(0, p.burst - s[1]) end

function interval.reset(p, s, now)
  if s[1] == 0 then return 0 end
  return max(0, s[2] + ceildiv(s[1], p.limit) * p.period - now)
end

function interval.retry(p, s, now, cost, ceiling)
  if interval.fits(p, s, now, cost, ceiling) then return 0 end
  local k = ceildiv(s[1] - (ceiling - cost), p.limit)
  return max(0, s[2] + k * p.period - now)
end

-- lua/30_fixed.lua
-- Fixed window. State {window start, count}. Windows are aligned to the
-- epoch, or (calendar rules) given by the caller as boundaries b0 < b1 < b2
-- around its own clock, since Redis has no time-zone data.
local fixed = {}

local function window(p, now)
  if p.cal == 0 then
    local ws = floordiv(now, p.period) * p.period
    return ws, ws + p.period
  end
  if now >= p.b1 then return p.b1, p.b2 end
  return p.b0, p.b1
end

function fixed.advance(p, s, now)
  local ws = window(p, now)
  if ws > s[1] then
    s[1], s[2] = ws, 0
  elseif ws < s[1] then
    now = s[1]
  end
  return now
end

function fixed.used(p, s, now) return s[2] end
function fixed.fits(p, s, now, cost, ceiling) return s[2] + cost <= ceiling end
function fixed.commit(p, s, now, cost) s[2] = s[2] + cost end
function fixed.clamp(p, s, now) s[2] = min(s[2], p.maxceil) end
function fixed.refund(p, s, now, cost) s[2] = max(0, s[2] - cost) end
function fixed.remaining(p, s, now) return max(0, p.burst - s[2]) end

function fixed.reset(p, s, now)
  if s[2] == 0 then return 0 end
  local _, e = window(p, now)
  return e - now
end

function fixed.retry(p, s, now, cost, ceiling)
  if fixed.fits(p, s, now, cost, ceiling) then return 0 end
  local _, e = window(p, now)
  return e - now
end

-- lua/40_log.lua
-- Sliding log. State {t1, t2, ...}: admitted request times, oldest first,
-- at most maxceil of them (maxceil + 1 with count rejected: a full window
-- told from an overfull one). An entry counts while now - t < P.
local slog = {}

function slog.advance(p, s, now)
  local n = #s
  if n > 0 and now < s[n] then now = s[n] end
  local drop = 0
  while drop < n and s[drop + 1] <= now - p.period do drop = drop + 1 end
  if drop > 0 then
    for i = 1, n - drop do s[i] = s[i + drop] end
    for i = n, n - drop + 1, -1 do s[i] = nil end
  end
  return now
end

function slog.used(p, s, now) return #s end
function slog.fits(p, s, now, cost, ceiling) return #s + cost <= ceiling end

-- logkeep drops the oldest entries beyond m.
local function logkeep(s, m)
  local over = #s - m
  if over > 0 then
    local n = #s
    for i = 1, n - over do s[i] = s[i + over] end
    for i = n, n - over + 1, -1 do s[i] = nil end
  end
end

function slog.commit(p, s, now, cost)
  local m = p.maxceil
  if p.cr then m = m + 1 end
  for _ = 1, min(cost, m) do s[#s + 1] = now end
  logkeep(s, m)
end

function slog.clamp(p, s, now) logkeep(s, p.maxceil) end

function slog.refund(p, s, now, cost)
  local n = #s
  for i = n, max(1, n - cost + 1), -1 do s[i] = nil end
end

function slog.remaining(p, s, now) return max(0, p.burst - #s) end

function slog.reset(p, s, now)
  if #s == 0 then return 0 end
  return s[#s] + p.period - now
end

function slog.retry(p, s, now, cost, ceiling)
  if slog.fits(p, s, now, cost, ceiling) then return 0 end
  local k = #s - (ceiling - cost) -- oldest entries that must expire
  return s[k] + p.period - now
end

-- lua/50_counter.lua
-- Sliding window counter. State {window start, previous count, current
-- count}; estimate = current + floor(previous * (P - elapsed) / P).
local counter = {}

function counter.advance(p, s, now)
  local ws = floordiv(now, p.period) * p.period
  if ws < s[1] then
    now = s[1]
  elseif ws == s[1] then
  elseif ws == s[1] + p.period then
    s[1], s[2], s[3] = ws, s[3], 0
  else
    s[1], s[2], s[3] = ws, 0, 0
  end
  return now
end

local function prevweight(p, s, now)
  if s[2] == 0 then return 0 end
  return (muldiv(s[2], p.period - (now - s[1]), p.period))
end

-- the least elapsed time e at which floor(x*(P-e)/P) <= a, for a >= 0
local function firstelapsed(p, x, a)
  if x <= a then return 0 end
  return max(0, p.period - muldivceil(a + 1, p.period, x) + 1)
end

function counter.used(p, s, now) return s[3] + prevweight(p, s, now) end
function counter.fits(p, s, now, cost, ceiling) return counter.used(p, s, now) + cost <= ceiling end
function counter.commit(p, s, now, cost) s[3] = s[3] + cost end
function counter.clamp(p, s, now) s[3] = min(s[3], p.maxceil) end

function counter.refund(p, s, now, cost)
  local x = min(cost, s[3])
  s[2] = max(0, s[2] - (cost - x))
  s[3] = s[3] - x
end

function counter.remaining(p, s, now) return max(0, p.burst - counter.used(p, s, now)) end

function counter.reset(p, s, now)
  if s[3] > 0 then return s[1] + p.period + firstelapsed(p, s[3], 0) - now end
  return max(0, s[1] + firstelapsed(p, s[2], 0) - now)
end

function counter.retry(p, s, now, cost, ceiling)
  if counter.fits(p, s, now, cost, ceiling) then return 0 end
  local a = ceiling - cost - s[3]
  if a >= 0 then return max(0, s[1] + firstelapsed(p, s[2], a) - now) end
  return s[1] + p.period + firstelapsed(p, s[3], ceiling - cost) - now
end

-- lua/60_subwindow.lua
-- Sliding window of sub-window counters. State {index, total, c0, ...,
-- c(N-1)}: counter k of sub-window j is at 3 + j % N.
local sub = {}

function sub.advance(p, s, now)
  local cur = floordiv(now, p.gran)
  if cur < s[1] then
    now = s[1] * p.gran
  elseif cur > s[1] then
    if s[2] ~= 0 then
      if cur - s[1] >= p.n then
        for k = 3, p.n + 2 do s[k] = 0 end
        s[2] = 0
      else
        for j = s[1] + 1, cur do
          local k = 3 + j % p.n
          s[2] = s[2] - s[k]
          s[k] = 0
        end
      end
    end
    s[1] = cur
  end
  return now
end

function sub.used(p, s, now) return s[2] end
function sub.fits(p, s, now, cost, ceiling) return s[2] + cost <= ceiling end

function sub.commit(p, s, now, cost)
  local k = 3 + s[1] % p.n
  s[k] = s[k] + cost
  s[2] = s[2] + cost
end

function sub.refund(p, s, now, cost)
  local j = s[1]
  while cost > 0 and s[2] > 0 and j > s[1] - p.n do
    local k = 3 + j % p.n
    local x = min(cost, s[k])
    s[k] = s[k] - x
    s[2] = s[2] - x
    cost = cost - x
    j = j - 1
  end
end

function sub.clamp(p, s, now)
  local x = s[2] - p.maxceil
  if x > 0 then sub.refund(p, s, now, x) end -- newest first, across sub-windows
end

function sub.remaining(p, s, now) return max(0, p.burst - s[2]) end

function sub.reset(p, s, now)
  if s[2] == 0 then return 0 end
  local j = s[1]
  while true do
    if s[3 + j % p.n] ~= 0 then return (j + p.n) * p.gran - now end
    j = j - 1
  end
end

function sub.retry(p, s, now, cost, ceiling)
  if sub.fits(p, s, now, cost, ceiling) then return 0 end
  local total = s[2]
  for j = s[1] - p.n + 1, s[1] do
    total = total - s[3 + j % p.n]
    if total <= ceiling - cost then return (j + p.n) * p.gran - now end
  end
  return 0
end

-- lua/80_convert.lua
-- Rule parameters, and converting state written under other parameters (a
-- changed limit) as internal/algo.Convert does.

local algos = {
  [K_TOKEN] = bucket, [K_METER] = bucket, [K_GCRA] = bucket, [K_SHAPER] = bucket,
  [K_INTERVAL] = interval, [K_FIXED] = fixed, [K_LOG] = slog,
  [K_COUNTER] = counter, [K_SUB] = sub,
}

local function gcd(a, b)
  while b ~= 0 do a, b = b, a % b end
  return a
end

-- parse reads a rule's signature, every parameter that gives its state a
-- meaning: kind|period|cal|location|weekday|limit|burst|gran|soft|elastic|
-- maxceil|countrejected, then, for a bucket whose exact units would pass
-- 2^51, |unit|rate (internal/algo's approxRate, computed once in Go). The
-- first five are its window: state converts verbatim between fixed windows
-- that share them.
local function parse(name, sig)
  local v, start = {}, 1
  while true do
    local bar = string.find(sig, '|', start, true)
    if bar == nil then
      v[#v + 1] = string.sub(sig, start)
      break
    end
    v[#v + 1] = string.sub(sig, start, bar - 1)
    start = bar + 1
  end
  local p = {
    name = name, sig = sig, kind = tonumber(v[1]), period = tonumber(v[2]), cal = tonumber(v[3]),
    limit = tonumber(v[6]), burst = tonumber(v[7]), gran = tonumber(v[8]), soft = tonumber(v[9]),
    elastic = tonumber(v[10]), maxceil = tonumber(v[11]), cr = v[12] == '1',
    wsig = v[1] .. '|' .. v[2] .. '|' .. v[3] .. '|' .. v[4] .. '|' .. v[5],
    b0 = 0, b1 = 0, b2 = 0,
  }
  p.algo = algos[p.kind]
  if p.algo == nil or p.period == nil or p.limit == nil or p.maxceil == nil then return nil end
  if v[13] then
    p.unit, p.rate = tonumber(v[13]), tonumber(v[14])
    if p.unit == nil or p.rate == nil or p.unit < 1 or p.rate < 1 then return nil end
  else
    local g = gcd(p.period, p.limit)
    p.unit, p.rate = p.period / g, p.limit / g
  end
  p.n = 0
  if p.gran > 0 then p.n = p.period / p.gran end
  return p
end

local function isbucket(k) return k == K_TOKEN or k == K_METER or k == K_GCRA or k == K_SHAPER end
local function cbits(p) if 2 * p.maxceil < 65536 then return 16 end return 32 end

-- convert returns the state ns (fresh, under np) holding what os (under op)
-- had consumed at now.
local function convert(op, os, np, ns, now)
  local t = op.algo.advance(op, os, now)
  local used = op.algo.used(op, os, t)
  if used == 0 then return ns end
  local c = np.maxceil
  if isbucket(op.kind) and isbucket(np.kind) then
    ns[1] = min(muldivceil(os[1], np.unit, op.unit), c * np.unit)
    ns[2] = t
    return ns
  elseif op.kind == K_INTERVAL and np.kind == K_INTERVAL then
    return {min(os[1], c), os[2]}
  elseif op.kind == K_FIXED and np.kind == K_FIXED and op.wsig == np.wsig then
    return {os[1], min(os[2], c)}
  elseif op.kind == K_LOG and np.kind == K_LOG and op.period == np.period then
    local m = min(#os, c)
    for i = 1, m do ns[i] = os[#os - m + i] end
    return ns
  elseif op.kind == K_COUNTER and np.kind == K_COUNTER and op.period == np.period then
    -- clamp the weighted total: the current count first, then the previous
    -- window's count, to the most whose weight still fits
    local prev, cur = os[2], min(os[3], c)
    if prev > 0 then
      prev = min(prev, muldivceil(c - cur + 1, np.period, np.period - (t - os[1])) - 1)
    end
    return {os[1], prev, cur}
  elseif op.kind == K_SUB and np.kind == K_SUB and op.gran == np.gran and op.n == np.n and cbits(op) == cbits(np) then
    for k = 1, #os do ns[k] = os[k] end
    sub.clamp(np, ns, t)
    return ns
  end
  -- Different algorithm or window: count what was consumed as consumed now.
  np.algo.advance(np, ns, t)
  np.algo.commit(np, ns, t, min(used, c))
  return ns
end

-- Parsed parameters by name, then signature (no string is built per
-- call). As a function library the cache
-- lives as long as the library; as a plain script, for one call.
local pcache, pcount = {}, 0

local function params(name, sig)
  local byname = pcache[name]
  local p = byname and byname[sig]
  if p == nil then
    p = parse(name, sig)
    if p == nil then return nil end
    if pcount >= 4096 then pcache, pcount = {}, 0 end
    byname = pcache[name]
    if byname == nil then
      byname = {}
      pcache[name] = byname
    end
    byname[sig], pcount = p, pcount + 1
  end
  return p
end

-- lua/90_apply.lua
-- The dispatcher: one key, every rule of its policy, all or nothing, as
-- internal/algo.ApplyTo does.
--
-- A decision's key holds, MessagePack-encoded, the flat list name1,
-- signature1, state1, name2, ... of its policy's rules. Two entry points:
--
-- apply    one decision. keys[1] its key; argv: now (0: Redis TIME), op,
--          cost, max delay, spare mask, rule count, then per rule: name,
--          signature (see 80_convert.lua) and the calendar bounds b0, b1,
--          b2 (redisstore/script.go).
-- batch    several decisions, in order (redisstore's coalescing of
--          concurrent callers). keys[i] is decision i's key; argv: the
--          policy count, then per policy its rule count and per rule its
--          name and signature; then per decision one string, big-endian:
--          its policy (uint16, 1-based), then as int64s now, op, cost, max
--          delay, spare mask, and b0, b1, b2 for each calendar rule of its
--          policy. Redis TIME is read once.
--
-- A decision returns {allowed, too large, excess, deciding rule (0-based),
-- limit, remaining, reset after, retry after, delay, now}; in a batch, the
-- same packed in a 52-byte string, or, for a decision that fails, an error
-- in its place, alone.

local OP_ALLOW, OP_PEEK, OP_RESERVE, OP_CHARGE, OP_REFUND, OP_RESET = 0, 1, 2, 3, 4, 5
local RULE_FIELDS = 5

local function fresh(p)
  if p.kind == K_LOG then return {} end
  local s = {0, 0}
  if p.kind == K_COUNTER then s[3] = 0 end
  if p.kind == K_SUB then for k = 3, p.n + 2 do s[k] = 0 end end
  return s
end

local function redisnow()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Tables reused by every call (Lua runs one call at a time); entries
-- past the policy's rule count are stale and never read.
local scratch = {ps = {}, st = {}, nows = {}, ceils = {}, fit = {}, delay = {}, out = {}}

-- ttlstring returns a TTL in ms as SET's argument, a string: a Lua number
-- would be formatted with %.17g (by a slower snprintf). Each is formatted
-- once and kept (up to 1,024), since decisions close in time write the
-- same TTLs.
local ttls, nttls = {}, 0
local function ttlstring(ms)
  local t = ttls[ms]
  if t == nil then
    t = string.format('%d', ms)
    if nttls >= 1024 then ttls, nttls = {}, 0 end
    if ms == ms then ttls[ms], nttls = t, nttls + 1 end -- NaN: no key
  end
  return t
end

-- decide makes one decision on key under the rules ps[1..n] (their
-- calendar bounds set), and returns its ten numbers.
local function decide(key, ps, n, now, op, cost, maxdelay, spare)
  -- Load each rule's state by name; convert state written under other
  -- parameters. A stored rule this policy version no longer has is dropped
  -- at once (by writing the key back), as the memory store converts a key
  -- at a new version: a rule added back later starts fresh.
  local v, nstored = nil, 0
  local raw = redis.call('GET', key)
  if raw then
    v = cmsgpack.unpack(raw)
    nstored = #v / 3
  end
  local st, nows, ceils = scratch.st, scratch.nows, scratch.ceils
  local write = false
  local matched = 0
  for i = 1, n do
    local p = ps[i]
    local s
    if v then
      for j = 1, #v, 3 do
        if v[j] == p.name then
          matched = matched + 1
          if v[j + 1] == p.sig then
            s = v[j + 2]
          else
            local oldp = parse(p.name, v[j + 1])
            s = fresh(p)
            if oldp then s = convert(oldp, v[j + 2], p, s, now) end
            write = true -- kept even if nothing else changes: it happened now
          end
          break
        end
      end
    end
    if s == nil then s = fresh(p) end
    st[i] = s
    nows[i] = p.algo.advance(p, s, now)
    if p.soft > 0 then ceils[i] = p.soft
    elseif p.elastic > 0 and floor(spare / 2 ^ (i - 1)) % 2 == 1 then ceils[i] = p.elastic
    else ceils[i] = p.burst end
  end
  if matched < nstored then write = true end

  local allowed, toolarge, excess, rule, delayout = true, false, false, 0, 0
  local fit, delay = scratch.fit, scratch.delay

  if op == OP_RESET then
    redis.call('DEL', key)
    for i = 1, n do st[i] = fresh(ps[i]) end
    write = false
  elseif op == OP_REFUND then
    for i = 1, n do local p = ps[i] p.algo.refund(p, st[i], nows[i], cost) end
    write = true
  elseif op == OP_PEEK or op == OP_CHARGE or op == OP_ALLOW then
    for i = 1, n do local p = ps[i]
      if cost > ceils[i] and not toolarge then
        allowed, toolarge, rule = false, true, i - 1
        if op ~= OP_CHARGE then break end
      end
      fit[i] = cost <= ceils[i] and p.algo.fits(p, st[i], nows[i], cost, ceils[i])
      allowed = allowed and fit[i]
    end
    if op == OP_CHARGE then
      for i = 1, n do local p = ps[i]
        p.algo.commit(p, st[i], nows[i], min(cost, p.maxceil))
        p.algo.clamp(p, st[i], nows[i])
      end
      write = true
    elseif op == OP_ALLOW and allowed then
      for i = 1, n do local p = ps[i] p.algo.commit(p, st[i], nows[i], cost) end
      write = true
    elseif op == OP_ALLOW and not toolarge then
      for i = 1, n do local p = ps[i]
        if p.cr then p.algo.commit(p, st[i], nows[i], cost); write = true end
      end
    end
  elseif op == OP_RESERVE then
    local longest = 0
    for i = 1, n do local p = ps[i]
      local s = st[i]
      if cost > ceils[i] then
        allowed, toolarge, rule = false, true, i - 1
        break
      end
      delay[i] = 0
      if p.kind == K_SHAPER then
        fit[i] = s[1] + cost * p.unit <= ceils[i] * p.unit
        delay[i] = ceildiv(s[1], p.rate)
      elseif p.algo.fits(p, s, nows[i], cost, ceils[i]) then
        fit[i] = true
      elseif p.algo == bucket or p.kind == K_INTERVAL then
        fit[i] = true
        delay[i] = p.algo.retry(p, s, nows[i], cost, ceils[i])
      else
        fit[i] = false
      end
      allowed = allowed and fit[i]
      longest = max(longest, delay[i])
    end
    if longest > maxdelay then allowed = false end
    if allowed then
      delayout = longest
      for i = 1, n do local p = ps[i] p.algo.commit(p, st[i], nows[i], cost) end
      write = true
    end
  end

  -- Report from the deciding rule.
  local best, bestrem, bestreset, bestretry = -1, 0, 0, 0
  local maxreset, anyused = 0, false
  for i = 1, n do local p = ps[i]
    local s, t = st[i], nows[i]
    local rem = p.algo.remaining(p, s, t)
    local reset = p.algo.reset(p, s, t)
    local retry = 0
    if not allowed and not toolarge then retry = p.algo.retry(p, s, t, cost, ceils[i]) end
    local used = p.algo.used(p, s, t)
    if allowed and (p.soft > 0 or p.elastic > 0) and used > p.burst then excess = true end
    if used > 0 then anyused = true end
    maxreset = max(maxreset, reset)
    local better
    if best < 0 then better = true
    elseif toolarge then better = (i - 1 == rule)
    elseif not allowed then better = retry > bestretry or (retry == bestretry and rem < bestrem)
    else better = rem < bestrem or (rem == bestrem and reset > bestreset) end
    if better then best, bestrem, bestreset, bestretry = i - 1, rem, reset, retry end
  end
  if not toolarge then rule = best end
  local dp = ps[rule + 1]
  local remaining, resetafter, retryafter = bestrem, bestreset, bestretry
  if rule ~= best then
    remaining = dp.algo.remaining(dp, st[rule + 1], nows[rule + 1])
    resetafter = dp.algo.reset(dp, st[rule + 1], nows[rule + 1])
  end
  if allowed then retryafter = 0 end

  -- Persist every rule's state with its signature, with a TTL no longer
  -- than the state can matter; a key back at fresh goes.
  if write then
    if not anyused then
      redis.call('DEL', key)
    else
      local out = scratch.out
      for i = 1, n do
        out[3 * i - 2], out[3 * i - 1], out[3 * i] = ps[i].name, ps[i].sig, st[i]
      end
      for k = 3 * n + 1, #out do out[k] = nil end
      redis.call('SET', key, cmsgpack.pack(out), 'PX', ttlstring(ceildiv(maxreset, 1000) + 1))
    end
  end

  return allowed and 1 or 0, toolarge and 1 or 0, excess and 1 or 0, rule, dp.limit, remaining, resetafter, retryafter, delayout, now
end

local function badsig(sig) return redis.error_reply('floodgate: bad rule signature ' .. tostring(sig)) end

-- readrules reads apply's arguments (argv[6] rules after five numbers)
-- into ps: each rule's parameters, its calendar bounds set. It returns the
-- rule count, or nil and an error reply for a signature it cannot read.
local function readrules(argv, ps)
  local n = tonumber(argv[6])
  for i = 1, n do
    local b = 6 + (i - 1) * RULE_FIELDS
    local p = params(argv[b + 1], argv[b + 2])
    if p == nil then return nil, badsig(argv[b + 2]) end
    if p.cal ~= 0 then
      p.b0, p.b1, p.b2 = tonumber(argv[b + 3]), tonumber(argv[b + 4]), tonumber(argv[b + 5])
    end
    ps[i] = p
  end
  return n
end

local function apply(keys, argv)
  local now = tonumber(argv[1])
  if now == 0 then now = redisnow() end
  local ps = scratch.ps
  local n, bad = readrules(argv, ps)
  if n == nil then return bad end
  return {decide(keys[1], ps, n, now, tonumber(argv[2]), tonumber(argv[3]), tonumber(argv[4]), tonumber(argv[5]))}
end

-- batch makes the decisions of keys in order. grouped: argv's packed
-- decisions carry a group byte after the policy index; the decisions with
-- the same nonzero group byte, side by side or not, are all or nothing (the
-- floodgate.GroupStore contract): every OP_ALLOW member is first checked as
-- OP_PEEK; if all fit they are decided as OP_ALLOW, and if not, only those
-- that do not fit on their own are (denied), the others keeping their
-- check. Redis runs the call alone, so nothing sees a group half done.
local function batch(keys, argv, grouped)
  local pols, o = {}, 1
  for i = 1, tonumber(argv[1]) do
    local n, ps = tonumber(argv[o + 1]), {}
    for r = 1, n do
      local p = params(argv[o + 2 * r], argv[o + 2 * r + 1])
      if p == nil then return badsig(argv[o + 2 * r + 1]) end
      ps[r] = p
    end
    pols[i] = ps
    o = o + 1 + 2 * n
  end
  local out, tnow = {}, nil
  local layout = '>Hi8i8i8i8i8'
  if grouped then layout = '>HBi8i8i8i8i8' end
  -- the last decision's string and its numbers: a batch's decisions often
  -- carry the same (one policy, op and cost, Redis's clock), unpacked once
  -- (ls starts as no string, nor nil)
  local ls, lpi, lnow, lop, lcost, lmaxdelay, lspare, lnx = false
  -- run decides decision i (as op `as`, or its own when nil) into out[i],
  -- and returns whether it was allowed and its own op.
  local function run(i, as)
    local s = argv[o + i]
    local pi, now, op, cost, maxdelay, spare, nx
    if s == ls then
      pi, now, op, cost, maxdelay, spare, nx = lpi, lnow, lop, lcost, lmaxdelay, lspare, lnx
    else
      if grouped then
        local _
        pi, _, now, op, cost, maxdelay, spare, nx = struct.unpack(layout, s)
      else
        pi, now, op, cost, maxdelay, spare, nx = struct.unpack(layout, s)
      end
      ls, lpi, lnow, lop, lcost, lmaxdelay, lspare, lnx = s, pi, now, op, cost, maxdelay, spare, nx
    end
    local ps = pols[pi]
    if now == 0 then
      tnow = tnow or redisnow()
      now = tnow
    end
    local n = #ps
    for r = 1, n do
      local p = ps[r]
      if p.cal ~= 0 then p.b0, p.b1, p.b2, nx = struct.unpack('>i8i8i8', s, nx) end
    end
    local ok, a, b, c, d, e, f, g, h, k, l = pcall(decide, keys[i], ps, n, now, as or op, cost, maxdelay, spare)
    if ok then
      -- 52 bytes, big-endian: four flags/indexes of one byte, six 64-bit
      -- integers (redisstore's decideMessage); cheaper to build, send
      -- and parse than an array of ten integers. The four bytes (flags
      -- of 0 or 1, and the rule's index, below algo.MaxRules, taken mod
      -- 256 as 'B' would) go as one 32-bit word: the same bytes, packed
      -- faster.
      out[i] = struct.pack('>I4i8i8i8i8i8i8', a * 16777216 + b * 65536 + c * 256 + d % 256, e, f, g, h, k, l)
    elseif type(a) == 'table' and a.err then
      out[i] = redis.error_reply(a.err)
    else
      out[i] = redis.error_reply(tostring(a))
    end
    return ok and a == 1, op
  end
  local nk = #keys
  if not grouped then
    for i = 1, nk do run(i, nil) end
    return out
  end
  -- a group is decided where its first member stands, with every later
  -- member of its byte, wherever they are
  local done = {}
  for i = 1, nk do
    local g = string.byte(argv[o + i], 3)
    if g == 0 then
      run(i, nil)
    elseif not done[i] then
      local ms = {}
      for m = i, nk do
        if string.byte(argv[o + m], 3) == g then
          ms[#ms + 1] = m
          done[m] = true
        end
      end
      local all, fits, ops = true, {}, {}
      for _, m in ipairs(ms) do
        fits[m], ops[m] = run(m, OP_PEEK)
        if ops[m] == OP_ALLOW and not fits[m] then all = false end
      end
      for _, m in ipairs(ms) do
        if ops[m] == OP_ALLOW and (all or not fits[m]) then run(m, nil) end
      end
    end
  end
  return out
end

-- lua/95_move.lua
-- move carries a key's state from one policy to another (Store.Move, the
-- floodgate.Mover contract): keys[1] the key under the old policy, keys[2]
-- under the new one (one slot: they share the key's hash tag); argv as
-- apply's (now, then four unused numbers, the new policy's rule count and
-- per rule its name, signature and calendar bounds). Each new rule takes
-- the state of the stored rule of its name, converted as a changed limit
-- is (convert); new rules start fresh. What the new key already held is
-- added on top (ontop). The old key goes; with no old key,
-- the new one is left as it is. Returns 1 if a state was carried, else 0.
-- ontop adds to s (the state carried to rule p) what the key already held
-- under p (had: its stored rules), as consumed now and clamped to p's
-- capacity, as floodgate.Policy.MigrateOnto does: a request decided under
-- the new policy in the moment before the move is kept.
local function ontop(p, s, had, now)
  for j = 1, #had, 3 do
    if had[j] == p.name then
      local hp, hs = p, had[j + 2]
      if had[j + 1] ~= p.sig then hp = parse(p.name, had[j + 1]) end
      if hp == nil then return end
      local used = hp.algo.used(hp, hs, hp.algo.advance(hp, hs, now))
      if used == 0 then return end
      local t = p.algo.advance(p, s, now)
      if isbucket(p.kind) and hp.sig == p.sig then
        s[1] = min(s[1] + hs[1], p.maxceil * p.unit)
      else
        local room = p.maxceil - p.algo.used(p, s, t)
        if room > 0 then p.algo.commit(p, s, t, min(used, room)) end
      end
      return
    end
  end
end

local function move(keys, argv)
  local raw = redis.call('GET', keys[1])
  if not raw then return 0 end
  local now = tonumber(argv[1])
  if now == 0 then now = redisnow() end
  local v = cmsgpack.unpack(raw)
  local had = redis.call('GET', keys[2])
  if had then had = cmsgpack.unpack(had) end
  local ps = {}
  local n, bad = readrules(argv, ps)
  if n == nil then return bad end
  local out, maxreset, anyused = {}, 0, false
  for i = 1, n do
    local p = ps[i]
    local s = fresh(p)
    for j = 1, #v, 3 do
      if v[j] == p.name then
        if v[j + 1] == p.sig then
          s = v[j + 2]
        else
          local oldp = parse(p.name, v[j + 1])
          if oldp then s = convert(oldp, v[j + 2], p, s, now) end
        end
        break
      end
    end
    if had then ontop(p, s, had, now) end
    local t = p.algo.advance(p, s, now)
    if p.algo.used(p, s, t) > 0 then anyused = true end
    maxreset = max(maxreset, p.algo.reset(p, s, t))
    out[3 * i - 2], out[3 * i - 1], out[3 * i] = p.name, p.sig, s
  end
  redis.call('DEL', keys[1])
  if anyused then
    redis.call('SET', keys[2], cmsgpack.pack(out), 'PX', string.format('%d', ceildiv(maxreset, 1000) + 1))
  else
    redis.call('DEL', keys[2])
  end
  return 1
end

return apply, batch, move
end
redis.register_function('floodgate_v1_apply', function(keys, args)
  if apply == nil then apply, batch, move = init() end
  return apply(keys, args)
end)
redis.register_function('floodgate_v1_batch_groups', function(keys, args)
  if apply == nil then apply, batch, move = init() end
  return batch(keys, args, true)
end)
redis.register_function('floodgate_v1_batch', function(keys, args)
  if apply == nil then apply, batch, move = init() end
  return batch(keys, args, false)
end)
redis.register_function('floodgate_v1_move', function(keys, args)
  if apply == nil then apply, batch, move = init() end
  return move(keys, args)
end)
