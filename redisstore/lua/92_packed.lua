-- packed: batch's decisions in a cheaper call (issue 19, exact mode's Redis
-- CPU). The same decisions as batch with groups, on the same keys and
-- values, asked with two arguments instead of one per rule and decision,
-- with one reply string, and with the Envoy request's decision (OP_ALLOW
-- of a small cost under one fixed-window rule, on Redis's clock) made
-- inline: the key's count read and written in place, no state table.
--
-- keys[i] is decision i's key. argv[1]: the call's policies, each its rule
-- count (a byte), then per rule its name and signature, each after its
-- length (uint16, big-endian); parsed once and kept, by the whole string
-- (a fleet's calls repeat a few of them). argv[2]: the decisions, one
-- record each, in keys' order:
--   0, policy (a byte, 1-based), group (a byte), cost (a byte, >= 1):
--      OP_ALLOW on Redis's clock, no delay, no spare mask, no calendar
--   1, policy, group, then as int64s now, op, cost, max delay, spare
--      mask, and b0, b1, b2 for each calendar rule of the policy
-- The group byte is batch's (all or nothing among equal nonzero bytes).
--
-- The reply is one string, a record per decision in order:
--   0 or 1 (refused, admitted), remaining and reset after (int64s): a
--      decision of the policy's one rule, retry after = reset after when
--      refused, every other field 0 (too large, excess, delay)
--   2, then batch's 52 bytes
--   3, a message's length (uint16) and the message: that decision failed

local pblobs, npblobs = {}, 0

-- readpblob returns argv[1]'s policies (each a list of rules), or nil and
-- an error reply.
local function readpblob(blob)
  local pl = pblobs[blob]
  if pl then return pl end
  pl = {}
  local pos, len = 1, #blob
  while pos <= len do
    local n = sbyte(blob, pos)
    pos = pos + 1
    local ps = {cal = false}
    for r = 1, n do
      local a, b = sbyte(blob, pos, pos + 1)
      if b == nil then return nil, badsig('(truncated)') end
      local name = ssub(blob, pos + 2, pos + 1 + a * 256 + b)
      pos = pos + 2 + a * 256 + b
      a, b = sbyte(blob, pos, pos + 1)
      if b == nil then return nil, badsig('(truncated)') end
      local sig = ssub(blob, pos + 2, pos + 1 + a * 256 + b)
      pos = pos + 2 + a * 256 + b
      local p = params(name, sig)
      if p == nil then return nil, badsig(sig) end
      ps[r] = p
      ps.cal = ps.cal or p.cal ~= 0
    end
    pl[#pl + 1] = ps
  end
  if npblobs >= 256 then pblobs, npblobs = {}, 0 end
  pblobs[blob], npblobs = pl, npblobs + 1
  return pl
end

-- Per decision of the call (Lua runs one call at a time; entries past a
-- call's count are stale): its record's kind, policy, group, cost (kind
-- 0) or position (kind 1), and its reply record.
local rkind, rpol, rgrp, rcost, rout = {}, {}, {}, {}, {}
local pnow = nil -- Redis TIME, read once a call when needed

-- fixedat sets on p (a fixed window with a period) what its decisions at
-- now share: the window's start, its end from now, the expiry (ms) and
-- TTL a write needs; once per call.
local function fixedat(p, now)
  if p.fnow == now then return end
  local ws = floor(now / p.period) * p.period
  local e = ws + p.period - now
  local ttl = ceildiv(e, 1000) + 1
  p.fnow, p.fws, p.fe, p.fms, p.fttl = now, ws, e, floor(now / 1000) + ttl, ttl
  if p.fhead == nil then
    -- the value's bytes before the state's words (packvalue's layout),
    -- and the 0-based offset of the count's 8 bytes (a string, SETRANGE's)
    local b = rulebytes(p)
    p.fhead = '\147' .. b .. '\146'
    p.flen = #p.fhead + 27
    p.fcount = string.format('%d', #p.fhead + 10)
  end
end

-- fastallow decides OP_ALLOW of cost (1 <= cost <= burst) on key under
-- the fixed-window rule p at Redis's now, as allow1 does, without the
-- state's table: it reads the value when it is in this release's layout
-- (or absent), writes the count in place (SETRANGE of its 8 bytes) while
-- the window and its TTL stand, else the whole value. It returns nil for
-- any other value (another layout, other parameters, a window ahead of
-- now, a key of another type), which decide then reads; else whether it admits, the remaining
-- and the reset after. peek: check only, write nothing.
local function fastallow(key, p, now, cost, peek)
  fixedat(p, now)
  -- pcall: a key of another type fails in decide, alone, not the call
  local raw = redis.pcall('GET', key)
  local ws, count, had = p.fws, 0, 0
  if type(raw) == 'table' then return nil end
  if raw then
    local head = p.fhead
    if #raw ~= p.flen or ssub(raw, 1, #head) ~= head then return nil end
    local t1, a, t2, c, t3, ms = sunpack('>Bi8Bi8Bi8', raw, #head + 1)
    if t1 ~= 0xcf or t2 ~= 0xcf or t3 ~= 0xcf or a > ws then return nil end
    if a == ws then count, had = c, ms end
  end
  local c = count + cost
  local allowed = c <= p.burst
  if peek then
    -- decide's OP_PEEK: nothing consumed; an unused window resets at 0
    local reset = p.fe
    if count == 0 then reset = 0 end
    return allowed, max(0, p.burst - count), reset
  end
  if allowed or p.cr then
    if had >= p.fms then
      redis.call('SETRANGE', key, p.fcount, spack('>i8', c))
    else
      redis.call('SET', key, p.fhead .. spack('>Bi8Bi8Bi8', 0xcf, ws, 0xcf, c, 0xcf, p.fms), 'PX', ttlstring(p.fttl))
    end
    count = c
  end
  -- count > 0 here (cost >= 1, and a refusal found it above burst - cost)
  return allowed, max(0, p.burst - count), p.fe
end

-- packedgeneral decides decision i through decide (as batch's run does),
-- as op `as` when not nil, and returns its reply record and whether it
-- was admitted.
local function packedgeneral(keys, d, ps, i, as)
  local now, op, cost, maxdelay, spare = 0, OP_ALLOW, rcost[i], 0, 0
  if rkind[i] == 1 then
    local nx
    now, op, cost, maxdelay, spare, nx = sunpack('>i8i8i8i8i8', d, rcost[i])
    if ps.cal then
      for r = 1, #ps do
        local p = ps[r]
        if p.cal ~= 0 then p.b0, p.b1, p.b2, nx = sunpack('>i8i8i8', d, nx) end
      end
    end
  end
  local rclock = now == 0
  if rclock then
    pnow = pnow or redisnow()
    now = pnow
  end
  local ok, a, b, c, dd, e, f, g, h, k, l = pcall(decide, keys[i], ps, #ps, now, rclock, as or op, cost, maxdelay, spare)
  if ok then
    return spack('>BI4i8i8i8i8i8i8', 2, a * 16777216 + b * 65536 + c * 256 + dd % 256, e, f, g, h, k, l), a == 1, op
  end
  local msg
  if type(a) == 'table' and a.err then msg = a.err else msg = tostring(a) end
  msg = ssub(msg, 1, 65535)
  return spack('>BI2', 3, #msg) .. msg, false, op
end

-- packedone decides decision i into rout[i] and returns whether it was
-- admitted (or, as OP_PEEK, fits) and its op.
local function packedone(keys, d, pl, i, as)
  local ps = pl[rpol[i]]
  if rkind[i] == 0 and #ps == 1 then
    local p = ps[1]
    if p.fx and rcost[i] <= p.burst then
      pnow = pnow or redisnow()
      local allowed, rem, e = fastallow(keys[i], p, pnow, rcost[i], as == OP_PEEK)
      if allowed ~= nil then
        rout[i] = spack('>Bi8i8', allowed and 1 or 0, rem, e)
        return allowed, OP_ALLOW
      end
    end
  end
  local out, allowed, op = packedgeneral(keys, d, ps, i, as)
  rout[i] = out
  return allowed, op
end

local function packed(keys, argv)
  local pl, bad = readpblob(argv[1])
  if pl == nil then return bad end
  local d = argv[2]
  local nk = #keys
  pnow = nil
  -- read the records
  local pos, grouped = 1, false
  for i = 1, nk do
    local kind, pi, g = sbyte(d, pos, pos + 2)
    if g == nil or pl[pi] == nil or kind > 1 then return redis.error_reply('floodgate: bad decision record ' .. i) end
    rkind[i], rpol[i], rgrp[i] = kind, pi, g
    grouped = grouped or g ~= 0
    if kind == 0 then
      rcost[i] = sbyte(d, pos + 3)
      pos = pos + 4
    else
      rcost[i] = pos + 3 -- the numbers' position
      pos = pos + 43
      if pl[pi].cal then
        for _, p in ipairs(pl[pi]) do
          if p.cal ~= 0 then pos = pos + 24 end
        end
      end
    end
  end
  if pos ~= #d + 1 then return redis.error_reply('floodgate: bad decision records') end
  if not grouped then
    for i = 1, nk do packedone(keys, d, pl, i, nil) end
  else
    -- as batch: a group is decided where its first member stands, with
    -- every later member of its byte; its OP_ALLOW members are checked
    -- first, and admitted all, or only those that do not fit decided
    local done = nil
    for i = 1, nk do
      local g = rgrp[i]
      if g == 0 then
        packedone(keys, d, pl, i, nil)
      elseif not (done and done[i]) then
        done = done or {}
        local ms = {}
        for m = i, nk do
          if rgrp[m] == g then
            ms[#ms + 1] = m
            done[m] = true
          end
        end
        local all, fits, ops = true, {}, {}
        for _, m in ipairs(ms) do
          fits[m], ops[m] = packedone(keys, d, pl, m, OP_PEEK)
          if ops[m] == OP_ALLOW and not fits[m] then all = false end
        end
        for _, m in ipairs(ms) do
          if ops[m] == OP_ALLOW and (all or not fits[m]) then packedone(keys, d, pl, m, nil) end
        end
      end
    end
  end
  for i = nk + 1, #rout do rout[i] = nil end
  return table.concat(rout, '', 1, nk)
end
