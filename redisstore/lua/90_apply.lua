-- The dispatcher: one key, every rule of its policy, all or nothing, as
-- internal/algo.ApplyTo does.
--
-- A decision's key holds, MessagePack-encoded, the flat list name1,
-- signature1, state1, name2, ... of its policy's rules (85_state.lua). Two
-- entry points:
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

-- num reads an integer argument: small ones (counts, ops, costs, a
-- client time of 0) from a table once seen, since tonumber (strtod) costs
-- about a thousand instructions a call.
local smallints = {}
local function num(s)
  local v = smallints[s]
  if v == nil then
    v = tonumber(s)
    if v and #s <= 3 then smallints[s] = v end -- a bounded set
  end
  return v
end

-- redisnow reads Redis TIME in µs, its seconds parsed once a second.
local lastsec, lastsecus = nil, 0
local function redisnow()
  local t = redis.call('TIME')
  if t[1] ~= lastsec then lastsec, lastsecus = t[1], tonumber(t[1]) * 1000000 end
  return lastsecus + tonumber(t[2])
end

-- Tables reused by every call (Lua runs one call at a time); entries
-- past the policy's rule count are stale and never read.
local scratch = {ps = {}, st = {}, nows = {}, ceils = {}, fit = {}, delay = {}, same = {}}


-- allow1 is decide for the commonest decision, OP_ALLOW under one rule,
-- on state s read in this release's layout (or fresh), with the same
-- results in fewer steps (as internal/algo's single.go): one rule decides,
-- and there is nothing to convert or drop.
local function allow1(key, ps, s, had, at, now, rclock, cost, spare)
  local p = ps[1]
  if p.fx and cost <= p.burst then
    -- a fixed window (fixed.advance, fits, commit, remaining, reset, retry
    -- inlined): the Envoy request's rule
    local ws = floor(now / p.period) * p.period
    if ws >= s[1] then
      if ws > s[1] then s[1], s[2] = ws, 0 end
      local burst, e = p.burst, ws + p.period - now
      local c = s[2] + cost
      local allowed = c <= burst
      if allowed or p.cr then
        s[2] = c
        if c == 0 then
          redis.call('DEL', key)
        else
          local ttl = ceildiv(e, 1000) + 1
          local st = scratch.st
          st[1] = s
          store(key, ps, st, 1, rclock, floor(now / 1000) + ttl, had, ttl, at)
        end
      end
      c = s[2]
      local reset, retry = e, e
      if c == 0 then reset = 0 end
      if allowed then retry = 0 end
      return allowed and 1 or 0, 0, 0, 0, p.limit, max(0, burst - c), reset, retry, 0, now
    end
  end
  local a = p.algo
  local t = a.advance(p, s, now)
  local ceiling = p.burst
  if p.soft > 0 then ceiling = p.soft
  elseif p.elastic > 0 and spare % 2 == 1 then ceiling = p.elastic end
  local toolarge = cost > ceiling
  local allowed, write = false, false
  if not toolarge then allowed = a.fits(p, s, t, cost, ceiling) end
  if allowed or (p.cr and not toolarge) then
    a.commit(p, s, t, cost)
    write = true
  end
  local rem, reset = a.remaining(p, s, t), a.reset(p, s, t)
  local retry = 0
  if not allowed and not toolarge then retry = a.retry(p, s, t, cost, ceiling) end
  local used = a.used(p, s, t)
  local excess = allowed and (p.soft > 0 or p.elastic > 0) and used > p.burst
  if write then
    if used == 0 then
      redis.call('DEL', key)
    else
      local ttl = ceildiv(reset, 1000) + 1
      local st = scratch.st
      st[1] = s
      store(key, ps, st, 1, rclock, floor(now / 1000) + ttl, had, ttl, at)
    end
  end
  return allowed and 1 or 0, toolarge and 1 or 0, excess and 1 or 0, 0, p.limit, rem, reset, retry, 0, now
end

-- decide makes one decision on key under the rules ps[1..n] (their
-- calendar bounds set), at now, from Redis TIME when rclock, and returns
-- its ten numbers.
local function decide(key, ps, n, now, rclock, op, cost, maxdelay, spare)
  -- Load each rule's state (85_state.lua: converted when stored under
  -- other parameters, a dropped rule making the key be written back).
  local st, nows, ceils = scratch.st, scratch.nows, scratch.ceils
  local exists, fast, had, write, at = loadstates(key, ps, n, st, now, nil)
  if n == 1 and op == OP_ALLOW and (fast or not exists) then
    return allow1(key, ps, st[1], had, at, now, rclock, cost, spare)
  end
  for i = 1, n do
    local p = ps[i]
    nows[i] = p.algo.advance(p, st[i], now)
    if p.soft > 0 then ceils[i] = p.soft
    elseif p.elastic > 0 and floor(spare / 2 ^ (i - 1)) % 2 == 1 then ceils[i] = p.elastic
    else ceils[i] = p.burst end
  end

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
      local ttl = ceildiv(maxreset, 1000) + 1
      store(key, ps, st, n, rclock, floor(now / 1000) + ttl, had, ttl)
    end
  end

  return allowed and 1 or 0, toolarge and 1 or 0, excess and 1 or 0, rule, dp.limit, remaining, resetafter, retryafter, delayout, now
end

local function badsig(sig) return redis.error_reply('floodgate: bad rule signature ' .. tostring(sig)) end

-- readrules reads apply's arguments (argv[6] rules after five numbers)
-- into ps: each rule's parameters, its calendar bounds set. It returns the
-- rule count, or nil and an error reply for a signature it cannot read.
local function readrules(argv, ps)
  local n = num(argv[6])
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
  local now = num(argv[1])
  local rclock = now == 0
  if rclock then now = redisnow() end
  local ps = scratch.ps
  local n, bad = readrules(argv, ps)
  if n == nil then return bad end
  return {decide(keys[1], ps, n, now, rclock, num(argv[2]), num(argv[3]), num(argv[4]), num(argv[5]))}
end

-- One batch call's state, kept between calls (Lua runs one call at a
-- time) so that a call creates no closure and few tables: the policies'
-- rule lists (pols, entries past the call's count stale), Redis TIME once
-- read (bnow), and the last decision's string and its numbers (a batch's
-- decisions often carry the same: one policy, op and cost, Redis's clock),
-- unpacked once.
local pols = {}
local bnow, ls, lpi, lnow, lop, lcost, lmaxdelay, lspare, lnx = nil, false

-- readpolicies reads batch's policies (argv: their count, then per policy
-- its rule count and per rule its name and signature) into pols, and
-- returns the index of the argument before the first decision's, or nil
-- and an error reply.
local function readpolicies(argv)
  local o = 1
  for i = 1, num(argv[1]) do
    local n, ps = num(argv[o + 1]), nil
    if n == 1 then -- the list of one rule, kept with it
      local p = params(argv[o + 2], argv[o + 3])
      if p == nil then return nil, badsig(argv[o + 3]) end
      ps = p.one
      if ps == nil then
        ps = {p, cal = p.cal ~= 0}
        p.one = ps
      end
    else
      ps = {cal = false}
      for r = 1, n do
        local p = params(argv[o + 2 * r], argv[o + 2 * r + 1])
        if p == nil then return nil, badsig(argv[o + 2 * r + 1]) end
        ps[r] = p
        ps.cal = ps.cal or p.cal ~= 0
      end
    end
    pols[i] = ps
    o = o + 1 + 2 * n
  end
  for i = num(argv[1]) + 1, #pols do pols[i] = nil end -- no stale policy
  return o
end

-- run decides batch's decision i (as op `as`, or its own when nil) into
-- out[i], and returns whether it was allowed and its own op.
local function run(keys, argv, o, out, grouped, i, as)
  local s = argv[o + i]
  local pi, now, op, cost, maxdelay, spare, nx
  if s == ls then
    pi, now, op, cost, maxdelay, spare, nx = lpi, lnow, lop, lcost, lmaxdelay, lspare, lnx
  else
    if grouped then
      local _
      pi, _, now, op, cost, maxdelay, spare, nx = sunpack('>HBi8i8i8i8i8', s)
    else
      pi, now, op, cost, maxdelay, spare, nx = sunpack('>Hi8i8i8i8i8', s)
    end
    ls, lpi, lnow, lop, lcost, lmaxdelay, lspare, lnx = s, pi, now, op, cost, maxdelay, spare, nx
  end
  local ps = pols[pi]
  local rclock = now == 0
  if rclock then
    bnow = bnow or redisnow()
    now = bnow
  end
  local n = #ps
  if ps.cal then
    for r = 1, n do
      local p = ps[r]
      if p.cal ~= 0 then p.b0, p.b1, p.b2, nx = sunpack('>i8i8i8', s, nx) end
    end
  end
  local ok, a, b, c, d, e, f, g, h, k, l = pcall(decide, keys[i], ps, n, now, rclock, as or op, cost, maxdelay, spare)
  if ok then
    -- 52 bytes, big-endian: four flags/indexes of one byte, six 64-bit
    -- integers (redisstore's decideMessage); cheaper to build, send
    -- and parse than an array of ten integers. The four bytes (flags
    -- of 0 or 1, and the rule's index, below algo.MaxRules, taken mod
    -- 256 as 'B' would) go as one 32-bit word: the same bytes, packed
    -- faster.
    out[i] = spack('>I4i8i8i8i8i8i8', a * 16777216 + b * 65536 + c * 256 + d % 256, e, f, g, h, k, l)
  elseif type(a) == 'table' and a.err then
    out[i] = redis.error_reply(a.err)
  else
    out[i] = redis.error_reply(tostring(a))
  end
  return ok and a == 1, op
end

-- batch makes the decisions of keys in order. grouped: argv's packed
-- decisions carry a group byte after the policy index; the decisions with
-- the same nonzero group byte, side by side or not, are all or nothing (the
-- floodgate.GroupStore contract): every OP_ALLOW member is first checked as
-- OP_PEEK; if all fit they are decided as OP_ALLOW, and if not, only those
-- that do not fit on their own are (denied), the others keeping their
-- check. Redis runs the call alone, so nothing sees a group half done.
local function batch(keys, argv, grouped)
  local o, bad = readpolicies(argv)
  if o == nil then return bad end
  local out = {}
  bnow, ls = nil, false
  local nk = #keys
  if not grouped then
    for i = 1, nk do run(keys, argv, o, out, grouped, i, nil) end
    return out
  end
  -- a group is decided where its first member stands, with every later
  -- member of its byte, wherever they are
  local done = nil -- the members of groups decided
  for i = 1, nk do
    local g = sbyte(argv[o + i], 3)
    if g == 0 then
      run(keys, argv, o, out, grouped, i, nil)
    elseif not (done and done[i]) then
      done = done or {}
      local ms = {}
      for m = i, nk do
        if sbyte(argv[o + m], 3) == g then
          ms[#ms + 1] = m
          done[m] = true
        end
      end
      local all, fits, ops = true, {}, {}
      for _, m in ipairs(ms) do
        fits[m], ops[m] = run(keys, argv, o, out, grouped, m, OP_PEEK)
        if ops[m] == OP_ALLOW and not fits[m] then all = false end
      end
      for _, m in ipairs(ms) do
        if ops[m] == OP_ALLOW and (all or not fits[m]) then run(keys, argv, o, out, grouped, m, nil) end
      end
    end
  end
  return out
end
