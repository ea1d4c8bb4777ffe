-- Token bucket with interval refill. State {used, anchor}: Limit tokens come
-- back at anchor+P, anchor+2P, ..., the anchor set when a full bucket is
-- first drawn on.
local interval = {}

function interval.advance(p, s, now)
  if s[1] > 0 then
    if now < s[2] then now = s[2] end
    local d = now - s[2]
    if d >= p.period then
      local k = floordiv(d, p.period)
      if k >= ceildiv(s[1], p.limit) then
        s[1] = 0
      else
        s[1] = s[1] - k * p.limit
        s[2] = s[2] + k * p.period
      end
    end
  end
  return now
end

function interval.used(p, s, now) return s[1] end
function interval.fits(p, s, now, cost, ceiling) return s[1] + cost <= ceiling end

function interval.commit(p, s, now, cost)
  if s[1] == 0 then s[2] = now end
  s[1] = s[1] + cost
end

function interval.clamp(p, s, now) s[1] = min(s[1], p.maxceil) end
function interval.refund(p, s, now, cost) s[1] = max(0, s[1] - cost) end
function interval.remaining(p, s, now) return max(0, p.burst - s[1]) end

function interval.reset(p, s, now)
  if s[1] == 0 then return 0 end
  return max(0, s[2] + ceildiv(s[1], p.limit) * p.period - now)
end

function interval.retry(p, s, now, cost, ceiling)
  if interval.fits(p, s, now, cost, ceiling) then return 0 end
  local k = ceildiv(s[1] - (ceiling - cost), p.limit)
  return max(0, s[2] + k * p.period - now)
end
