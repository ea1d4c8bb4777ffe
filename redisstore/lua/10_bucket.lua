-- Bucket algorithms: token bucket, leaky meter, GCRA (identical), and the
-- leaky shaper. State {level, last}: level is consumed capacity in units
-- (Unit per request), draining Rate units per microsecond since last.
local bucket = {}

function bucket.advance(p, s, now)
  if now < s[2] then now = s[2] end
  if s[1] > 0 then
    if now - s[2] >= ceildiv(s[1], p.rate) then
      s[1] = 0
    else
      s[1] = s[1] - (now - s[2]) * p.rate
    end
  end
  s[2] = now
  return now
end

function bucket.used(p, s, now) return ceildiv(s[1], p.unit) end

function bucket.fits(p, s, now, cost, ceiling)
  if p.kind == K_SHAPER and cost ~= 0 and s[1] ~= 0 then return false end
  return s[1] + cost * p.unit <= ceiling * p.unit
end

function bucket.commit(p, s, now, cost) s[1] = s[1] + cost * p.unit end

function bucket.clamp(p, s, now) s[1] = min(s[1], p.maxceil * p.unit) end

function bucket.refund(p, s, now, cost)
  if cost >= ceildiv(s[1], p.unit) then s[1] = 0 else s[1] = s[1] - cost * p.unit end
end

function bucket.remaining(p, s, now)
  local r = (p.burst * p.unit - s[1]) / p.unit
  if r < 0 then return 0 end
  return floor(r)
end

function bucket.reset(p, s, now) return ceildiv(s[1], p.rate) end

function bucket.retry(p, s, now, cost, ceiling)
  if bucket.fits(p, s, now, cost, ceiling) then return 0 end
  if p.kind == K_SHAPER and cost ~= 0 then return ceildiv(s[1], p.rate) end
  return ceildiv(s[1] - (ceiling - cost) * p.unit, p.rate)
end
