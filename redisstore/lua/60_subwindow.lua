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
