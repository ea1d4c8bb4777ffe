-- Fixed window. State {window start, count}. Windows are aligned to the
-- epoch, or (calendar rules) given by the caller as boundaries b0 < b1 < b2
-- around its own clock, since Redis has no time-zone data.
local fixed = {}

local function window(p, now)
  if p.cal == 0 then
    local ws = floordiv(now, p.period) * p.period
    return ws, ws + p.period
  end
  if now >= p.b1 then return p.b1, p.b2 end
  return p.b0, p.b1
end

function fixed.advance(p, s, now)
  local ws = window(p, now)
  if ws > s[1] then
    s[1], s[2] = ws, 0
  elseif ws < s[1] then
    now = s[1]
  end
  return now
end

function fixed.used(p, s, now) return s[2] end
function fixed.fits(p, s, now, cost, ceiling) return s[2] + cost <= ceiling end
function fixed.commit(p, s, now, cost) s[2] = s[2] + cost end
function fixed.clamp(p, s, now) s[2] = min(s[2], p.maxceil) end
function fixed.refund(p, s, now, cost) s[2] = max(0, s[2] - cost) end
function fixed.remaining(p, s, now) return max(0, p.burst - s[2]) end

function fixed.reset(p, s, now)
  if s[2] == 0 then return 0 end
  local _, e = window(p, now)
  return e - now
end

function fixed.retry(p, s, now, cost, ceiling)
  if fixed.fits(p, s, now, cost, ceiling) then return 0 end
  local _, e = window(p, now)
  return e - now
end
