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
