-- Floodgate's decision script for Redis. It is the same integer math as
-- internal/algo in Go, on Lua numbers (doubles, exact to 2^53; every state
-- word and intermediate value stays below 2^53, and products that could not
-- are done by muldiv). Assembled from the files of redisstore/lua in name
-- order: helpers, one file per algorithm, then the dispatcher.

local floor = math.floor
local ceil = math.ceil
local max = math.max
local min = math.min

-- ceil(a/b) for b > 0; 0 for a <= 0. Exact: for integers below 2^53 the
-- rounded quotient never crosses an integer.
local function ceildiv(a, b)
  if a <= 0 then return 0 end
  return ceil(a / b)
end

local function floordiv(a, b)
  return floor(a / b)
end

-- floor(a*b/c) for a, b >= 0, c > 0, exact even when a*b passes 2^53:
-- schoolbook doubling over a's bits, keeping every value below 2^53.
local function muldiv(a, b, c)
  local p = a * b
  if p < 9007199254740992 then return floor(p / c) end
  local q, r = floor(b / c), b % c -- b = q*c + r
  -- a*b/c = a*q + a*r/c
  local hi = a * q
  local qa, ra = 0, 0
  local bits = {}
  local x = a
  while x > 0 do
    bits[#bits + 1] = x % 2
    x = floor(x / 2)
  end
  for i = #bits, 1, -1 do
    qa, ra = qa * 2, ra * 2
    if ra >= c then qa, ra = qa + 1, ra - c end
    if bits[i] == 1 then
      ra = ra + r
      if ra >= c then qa, ra = qa + 1, ra - c end
    end
  end
  return hi + qa, ra
end

-- ceil(a*b/c), exact.
local function muldivceil(a, b, c)
  local q, r = muldiv(a, b, c)
  if r == nil then
    local p = a * b
    if p % c ~= 0 then return q + 1 end
    return q
  end
  if r > 0 then return q + 1 end
  return q
end
