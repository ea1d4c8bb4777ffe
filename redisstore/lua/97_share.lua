-- share is local share's one call (redisstore/share.go): it gives back
-- what a node did not spend of an earlier slice, then takes a new slice
-- of the key's remaining quota. Every rule of the policy is a fixed window
-- with a period (floodgate.TierLocalShare). keys[1] the key; argv as
-- apply's (now, then four numbers, the rule count, per rule its name,
-- signature and calendar bounds), with the four numbers: t0 (the time the
-- earlier slice was taken), back (what is given back of it), want (the
-- slice wanted; 0: give back only), unused.
--
-- A slice is taken as one admission of its size: it counts on Redis at
-- once, so no node can spend more than what Redis counted. What is given
-- back is taken off each rule whose window is still the one the slice was
-- taken in (a rule whose window has moved on has forgotten it already).
--
-- Returns {granted, now, deciding rule (0-based), limit, remaining after,
-- reset after}.
local function giveback(key, ps, n, now, t0, back)
  local st, same = scratch.st, scratch.same
  local exists, _, had, write = loadstates(key, ps, n, st, now, same)
  if not exists then return end
  for i = 1, n do
    local p, s = ps[i], st[i]
    -- a rule stored under other parameters was converted, and the slice
    -- was not counted under these: nothing is given back to it
    if same[i] and s[1] == floordiv(t0, p.period) * p.period then
      s[2] = max(0, s[2] - back)
      write = true
    end
  end
  if write then redis.call('SET', key, packvalue(ps, st, n, had), 'KEEPTTL') end
end

local function share(keys, argv)
  local now = tonumber(argv[1])
  local rclock = now == 0
  if rclock then now = redisnow() end
  local ps = scratch.ps
  local n, bad = readrules(argv, ps)
  if n == nil then return bad end
  for i = 1, n do
    if ps[i].kind ~= K_FIXED or ps[i].cal ~= 0 then
      return redis.error_reply('floodgate: local share needs fixed windows with a period')
    end
  end
  local back, want = tonumber(argv[3]), tonumber(argv[4])
  if back > 0 then giveback(keys[1], ps, n, now, tonumber(argv[2]), back) end
  if want <= 0 then return {0, now, 0, 0, 0, 0} end
  local _, _, _, rule, limit, rem, reset = decide(keys[1], ps, n, now, rclock, OP_PEEK, 1, 0, 0)
  local g = min(want, rem)
  if g > 0 then
    _, _, _, rule, limit, rem, reset = decide(keys[1], ps, n, now, rclock, OP_ALLOW, g, 0, 0)
  end
  return {g, now, rule, limit, rem, reset}
end
