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
