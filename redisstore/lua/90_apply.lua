-- The dispatcher: one key, every rule of its policy, all or nothing, as
-- internal/algo.ApplyTo does.
--
-- KEYS[1]  the key's hash; one field per rule, named by the rule
-- ARGV     now (0: use Redis TIME), op, cost, max delay, spare mask, rule
--          count, then RULE_FIELDS values per rule (see redisstore/args.go)
-- returns  {allowed, too large, excess, deciding rule (0-based), limit,
--          remaining, reset after, retry after, delay, now}

local OP_ALLOW, OP_PEEK, OP_RESERVE, OP_CHARGE, OP_REFUND, OP_RESET = 0, 1, 2, 3, 4, 5
local RULE_FIELDS = 19

local key = KEYS[1]
local now = tonumber(ARGV[1])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local op = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local maxdelay = tonumber(ARGV[4])
local spare = tonumber(ARGV[5])
local n = tonumber(ARGV[6])

local ps = {}
local fields = {}
for i = 1, n do
  local b = 6 + (i - 1) * RULE_FIELDS
  local p = {
    name = ARGV[b + 1], kind = tonumber(ARGV[b + 2]), limit = tonumber(ARGV[b + 3]),
    period = tonumber(ARGV[b + 4]), burst = tonumber(ARGV[b + 5]), unit = tonumber(ARGV[b + 6]),
    rate = tonumber(ARGV[b + 7]), gran = tonumber(ARGV[b + 8]), n = tonumber(ARGV[b + 9]),
    soft = tonumber(ARGV[b + 10]), elastic = tonumber(ARGV[b + 11]), cr = ARGV[b + 12] == '1',
    cal = tonumber(ARGV[b + 13]), b0 = tonumber(ARGV[b + 14]), b1 = tonumber(ARGV[b + 15]),
    b2 = tonumber(ARGV[b + 16]), maxceil = tonumber(ARGV[b + 17]), sig = ARGV[b + 18],
    wsig = ARGV[b + 19],
  }
  p.algo = algos[p.kind]
  if p.algo == nil then return redis.error_reply('floodgate: unknown algorithm ' .. tostring(p.kind)) end
  ps[i] = p
  fields[i] = p.name
end

local function fresh(p)
  if p.kind == K_LOG then return {} end
  local s = {0, 0}
  if p.kind == K_COUNTER then s[3] = 0 end
  if p.kind == K_SUB then for k = 3, p.n + 2 do s[k] = 0 end end
  return s
end

-- Load each rule's state; convert state written under other parameters
-- (a changed limit) as internal/algo.Convert does.
local raw = redis.call('HMGET', key, unpack(fields))
local st, nows, ceils = {}, {}, {}
local converted = false

-- Fields of rules this policy version no longer has go at once, as the
-- memory store converts a key at a new version: a rule added back later
-- starts fresh.
local present = 0
for i = 1, n do if raw[i] then present = present + 1 end end
if redis.call('HLEN', key) > present then
  local keep = {}
  for _, f in ipairs(fields) do keep[f] = true end
  for _, f in ipairs(redis.call('HKEYS', key)) do
    if not keep[f] then redis.call('HDEL', key, f) end
  end
end
for i, p in ipairs(ps) do
  local s = fresh(p)
  if raw[i] then
    local v = cmsgpack.unpack(raw[i])
    if v[1] == p.sig then
      s = v[3]
    else
      s = convert(v[2], v[3], p, s, now)
      converted = true -- kept even if nothing else changes: it happened now
    end
  end
  st[i] = s
  nows[i] = p.algo.advance(p, s, now)
  local bit = floor(spare / 2 ^ (i - 1)) % 2 == 1
  if p.soft > 0 then ceils[i] = p.soft
  elseif p.elastic > 0 and bit then ceils[i] = p.elastic
  else ceils[i] = p.burst end
end

local allowed, toolarge, excess, rule, delayout = true, false, false, 0, 0
local fit, delay = {}, {}
local write = converted

if op == OP_RESET then
  redis.call('DEL', key)
  for i, p in ipairs(ps) do st[i] = fresh(p) end
elseif op == OP_REFUND then
  for i, p in ipairs(ps) do p.algo.refund(p, st[i], nows[i], cost) end
  write = true
elseif op == OP_PEEK or op == OP_CHARGE or op == OP_ALLOW then
  for i, p in ipairs(ps) do
    if cost > ceils[i] and not toolarge then
      allowed, toolarge, rule = false, true, i - 1
      if op ~= OP_CHARGE then break end
    end
    fit[i] = cost <= ceils[i] and p.algo.fits(p, st[i], nows[i], cost, ceils[i])
    allowed = allowed and fit[i]
  end
  if op == OP_CHARGE then
    for i, p in ipairs(ps) do
      p.algo.commit(p, st[i], nows[i], min(cost, p.maxceil))
      p.algo.clamp(p, st[i], nows[i])
    end
    write = true
  elseif op == OP_ALLOW and allowed then
    for i, p in ipairs(ps) do p.algo.commit(p, st[i], nows[i], cost) end
    write = true
  elseif op == OP_ALLOW and not toolarge then
    for i, p in ipairs(ps) do
      if p.cr then p.algo.commit(p, st[i], nows[i], cost); write = true end
    end
  end
elseif op == OP_RESERVE then
  local longest = 0
  for i, p in ipairs(ps) do
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
    for i, p in ipairs(ps) do p.algo.commit(p, st[i], nows[i], cost) end
    write = true
  end
end

-- Report from the deciding rule.
local best, bestrem, bestreset, bestretry = -1, 0, 0, 0
local maxreset, anyused = 0, false
for i, p in ipairs(ps) do
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

-- Persist: each rule's state with the parameters it was written under, and
-- a TTL no longer than the state can matter; a key back at fresh goes.
if write then
  if not anyused then
    redis.call('DEL', key)
  else
    local args = {}
    for i, p in ipairs(ps) do
      args[#args + 1] = p.name
      args[#args + 1] = cmsgpack.pack({p.sig,
        {p.kind, p.limit, p.period, p.burst, p.unit, p.rate, p.gran, p.n, p.soft, p.elastic,
         p.cr and 1 or 0, p.cal, p.b0, p.b1, p.b2, p.maxceil, p.wsig},
        st[i]})
    end
    redis.call('HSET', key, unpack(args))
    redis.call('PEXPIRE', key, ceildiv(maxreset, 1000) + 1)
  end
end

local function b(x) if x then return 1 end return 0 end
return {b(allowed), b(toolarge), b(excess), rule, dp.limit, remaining, resetafter, retryafter, delayout, now}
