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
  local had = redis.call('GET', keys[2])
  if had then had = unpackvalue(had) end
  local ps = {}
  local n, bad = readrules(argv, ps)
  if n == nil then return bad end
  -- the new states: each rule's of the old key (85_state.lua's reader)
  local out, maxreset, anyused = {}, 0, false
  loadstates(keys[1], ps, n, out, now, nil)
  for i = 1, n do
    local p, s = ps[i], out[i]
    if had then ontop(p, s, had, now) end
    local t = p.algo.advance(p, s, now)
    if p.algo.used(p, s, t) > 0 then anyused = true end
    maxreset = max(maxreset, p.algo.reset(p, s, t))
  end
  redis.call('DEL', keys[1])
  if anyused then
    redis.call('SET', keys[2], packvalue(ps, out, n, 0), 'PX', string.format('%d', ceildiv(maxreset, 1000) + 1))
  else
    redis.call('DEL', keys[2])
  end
  return 1
end
