-- Converting state written under other parameters (a changed limit), as
-- internal/algo.Convert does: keep what the key consumed, in requests,
-- clamped to the new rule's largest ceiling.

local algos = {
  [K_TOKEN] = bucket, [K_METER] = bucket, [K_GCRA] = bucket, [K_SHAPER] = bucket,
  [K_INTERVAL] = interval, [K_FIXED] = fixed, [K_LOG] = slog,
  [K_COUNTER] = counter, [K_SUB] = sub,
}

local function isbucket(k) return k == K_TOKEN or k == K_METER or k == K_GCRA or k == K_SHAPER end
local function cbits(p) if 2 * p.maxceil < 65536 then return 16 end return 32 end

-- convert returns the state ns (fresh, under np) holding what os (under
-- the stored parameters a) had consumed at now.
local function convert(a, os, np, ns, now)
  local op = {
    kind = a[1], limit = a[2], period = a[3], burst = a[4], unit = a[5], rate = a[6],
    gran = a[7], n = a[8], soft = a[9], elastic = a[10], cr = a[11] == 1, cal = a[12],
    b0 = a[13], b1 = a[14], b2 = a[15], maxceil = a[16], wsig = a[17],
  }
  op.algo = algos[op.kind]
  if op.algo == nil then return ns end
  local t = op.algo.advance(op, os, now)
  local used = op.algo.used(op, os, t)
  if used == 0 then return ns end
  local c = np.maxceil
  if isbucket(op.kind) and isbucket(np.kind) then
    ns[1] = min(muldivceil(os[1], np.unit, op.unit), c * np.unit)
    ns[2] = t
    return ns
  elseif op.kind == K_INTERVAL and np.kind == K_INTERVAL then
    return {min(os[1], c), os[2]}
  elseif op.kind == K_FIXED and np.kind == K_FIXED and op.wsig == np.wsig then
    return {os[1], min(os[2], c)}
  elseif op.kind == K_LOG and np.kind == K_LOG and op.period == np.period then
    local m = min(#os, c)
    for i = 1, m do ns[i] = os[#os - m + i] end
    return ns
  elseif op.kind == K_COUNTER and np.kind == K_COUNTER and op.period == np.period then
    -- clamp the weighted total: the current count first, then the previous
    -- window's count, to the most whose weight still fits
    local prev, cur = os[2], min(os[3], c)
    if prev > 0 then
      prev = min(prev, muldivceil(c - cur + 1, np.period, np.period - (t - os[1])) - 1)
    end
    return {os[1], prev, cur}
  elseif op.kind == K_SUB and np.kind == K_SUB and op.gran == np.gran and op.n == np.n and cbits(op) == cbits(np) then
    for k = 1, #os do ns[k] = os[k] end
    sub.clamp(np, ns, t)
    return ns
  end
  -- Different algorithm or window: count what was consumed as consumed now.
  np.algo.advance(np, ns, t)
  np.algo.commit(np, ns, t, min(used, c))
  return ns
end
