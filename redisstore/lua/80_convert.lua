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
  -- a fixed window with a period and no soft or elastic ceiling: allow1's
  -- shortest path
  p.fx = p.kind == K_FIXED and p.cal == 0 and p.soft == 0 and p.elastic == 0
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
