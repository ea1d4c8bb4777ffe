-- writeback adds a node's unsynced hits on one key to the window they were
-- admitted in, and may make one exact decision (redisstore/writeback.go).
-- The key's policy has one rule, a fixed window (no calendar) or a sliding
-- window counter. keys[1] the key; argv: now (0: Redis TIME), the rule's
-- name and signature, the hits' window start (0: none), the hits, and a
-- cost to decide exactly (0: none). Returns {allowed, the hits' window's
-- count before and after them (-1: that window is gone), then the state
-- now: window start, previous count, current count, and now, then the hits
-- applied (fewer than sent when wbonce found some applied already)}.

-- A fixed window's state written here keeps, after its two words, the
-- count and start of the window before (s[3], s[4]; decide carries them
-- along untouched), so that hits a node sends after the window ended are
-- still measured against it. fixedroll moves s on to window ws.
local function fixedroll(p, s, ws)
  if ws > s[1] then
    s[3], s[4] = s[2], s[1]
    s[1], s[2] = ws, 0
  end
end

-- wbwindow returns the index in s of window tag's count, or nil when s no
-- longer holds it; with add, s first moves on to tag if it is behind.
local function wbwindow(p, s, tag, add)
  if p.kind == K_FIXED then
    if add then fixedroll(p, s, tag) end
    if s[1] == tag then return 2 end
    if s[4] == tag then return 3 end
    return nil
  end
  if add and s[1] < tag then counter.advance(p, s, tag) end
  if s[1] == tag then return 3 end
  if s[1] == tag + p.period then return 2 end
  return nil
end

-- wbonce: idempotent syncs (writeback.go, "Idempotent syncs"). With a
-- second key, rec (the node's record of this key: the largest running
-- total of hits of the node's syncs it has applied), and argv[7], the
-- node's running total of hits sent on this key as of this sync, only what
-- the total adds beyond the record is applied: a sync Redis ran whose reply
-- the node lost, sent again, adds nothing, and syncs arriving out of order
-- add their hits once. Without a record (the node's first sync of the
-- key, or none for a minute) the sync's own hits are applied. Returns the
-- hits to apply.
local function wbonce(rec, hits, total)
  local last = tonumber(redis.call('GET', rec) or '')
  local add = hits
  if last then add = max(0, total - last) end
  if last == nil or total > last then
    redis.call('SET', rec, string.format('%d', total), 'PX', 60000)
  end
  return add
end

local function writeback(keys, argv)
  local now = tonumber(argv[1])
  local rclock = now == 0
  if rclock then now = redisnow() end
  local p = params(argv[2], argv[3])
  if p == nil then return badsig(argv[3]) end
  if (p.kind ~= K_FIXED and p.kind ~= K_COUNTER) or p.cal ~= 0 then
    return redis.error_reply('floodgate: write-back needs a fixed window with a period or a sliding window counter')
  end
  local tag, hits, cost = tonumber(argv[4]), tonumber(argv[5]), tonumber(argv[6])
  if keys[2] and hits > 0 then hits = wbonce(keys[2], hits, tonumber(argv[7])) end
  local key = keys[1]
  local ps, st = scratch.ps, scratch.st
  ps[1] = p
  local _, _, had = loadstates(key, ps, 1, st, now, nil)
  local s = st[1]
  local before, after = -1, -1
  if tag > 0 then
    local i = wbwindow(p, s, tag, hits > 0)
    if i then
      before = s[i]
      s[i] = s[i] + hits
      after = s[i]
    end
  end
  if p.kind == K_FIXED then fixedroll(p, s, floordiv(now, p.period) * p.period) end
  local t = p.algo.advance(p, s, now)
  local allowed = 0
  if cost > 0 and cost <= p.burst and p.algo.fits(p, s, t, cost, p.burst) then
    p.algo.commit(p, s, t, cost)
    allowed = 1
  end
  if hits > 0 or allowed == 1 then
    if p.algo.used(p, s, t) == 0 and s[2] == 0 and (s[3] or 0) == 0 then
      redis.call('DEL', key)
    else
      local reset = max(p.algo.reset(p, s, t), s[1] + p.period - t)
      local ttl = ceildiv(reset, 1000) + 1
      store(key, ps, st, 1, rclock, floor(now / 1000) + ttl, had, ttl)
    end
  end
  local prev, cur = 0, s[2]
  if p.kind == K_COUNTER then prev, cur = s[2], s[3] end
  return {allowed, before, after, s[1], prev, cur, t, hits}
end
