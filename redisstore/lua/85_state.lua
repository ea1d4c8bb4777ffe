-- A key's stored value: MessagePack, the array name1, signature1, state1,
-- name2, ... of its policy's rules, each state an array of integers, and
-- after it, when the key's TTL was set on Redis's clock, a second object:
-- the key's expiry in ms (an integer). Any version of the library reads
-- any value (cmsgpack.unpack, whose first object is the array), so
-- instances of two releases can share a Redis during an upgrade, whichever
-- loaded the library last. This release writes each integer in its
-- fixed-width form (0xcf uint64, or 0xd3 int64 below zero) after the
-- rule's name and signature encoded once (packvalue), and reads a value
-- laid out so by comparing those bytes and unpacking the integers in place
-- (unpackfast); anything else (a value of older releases, whose integers
-- have their shortest forms, a state of more than 15 words, another
-- policy's rules) goes through cmsgpack.unpack, as before.
--
-- The expiry lets a write keep the key's TTL (SET KEEPTTL, cheaper than
-- SET PX) when it already lasts long enough, as in a fixed window, whose
-- every write until the window ends needs the same expiry.

local sbyte, ssub, spack, sunpack = string.byte, string.sub, struct.pack, struct.unpack

-- rulebytes returns rule p's name and signature as MessagePack, kept on p.
local function rulebytes(p)
  local b = p.bytes
  if b == nil then
    b = cmsgpack.pack(p.name, p.sig)
    p.bytes = b
  end
  return b
end

-- arrayhead is MessagePack's header of an array of n items.
local function arrayhead(n)
  if n < 16 then return string.char(0x90 + n) end
  return spack('>BI2', 0xdc, n)
end

-- packstate returns state s as MessagePack: up to 15 integers each as 9
-- bytes, else as cmsgpack writes it.
local function packstate(s)
  local c = #s
  if c == 2 then
    local a, b = s[1], s[2]
    if a >= 0 and b >= 0 and a % 1 == 0 and b % 1 == 0 then
      return spack('>BBi8Bi8', 0x92, 0xcf, a, 0xcf, b)
    end
  elseif c < 16 then
    local parts = {string.char(0x90 + c)}
    for k = 1, c do
      local x = s[k]
      if x % 1 ~= 0 then return cmsgpack.pack(s) end
      if x < 0 then parts[k + 1] = spack('>Bi8', 0xd3, x) else parts[k + 1] = spack('>Bi8', 0xcf, x) end
    end
    return table.concat(parts)
  end
  return cmsgpack.pack(s)
end

-- packvalue returns the value of states st[1..n] under rules ps[1..n],
-- with expiry ms when it is not 0.
local function packvalue(ps, st, n, ms)
  local s = st[1]
  if n == 1 and ms > 0 and #s == 2 and s[1] >= 0 and s[2] >= 0 and s[1] % 1 == 0 and s[2] % 1 == 0 then
    -- one rule of two words, the commonest: one struct.pack
    return '\147' .. rulebytes(ps[1]) .. spack('>BBi8Bi8Bi8', 0x92, 0xcf, s[1], 0xcf, s[2], 0xcf, ms)
  end
  local tail = ''
  if ms > 0 then tail = spack('>Bi8', 0xcf, ms) end
  if n == 1 then return '\147' .. rulebytes(ps[1]) .. packstate(st[1]) .. tail end
  local parts = {arrayhead(3 * n)}
  for i = 1, n do
    parts[2 * i], parts[2 * i + 1] = rulebytes(ps[i]), packstate(st[i])
  end
  parts[2 * n + 2] = tail
  return table.concat(parts)
end

-- unpackstate reads a state written by packstate at pos: the state and
-- the position after it, or nil.
local function unpackstate(raw, pos)
  local h = sbyte(raw, pos)
  if h == nil or h < 0x90 or h > 0x9f or #raw < pos + 9 * (h - 0x90) then return nil end
  if h == 0x92 then
    local t1, a, t2, b, nx = sunpack('>Bi8Bi8', raw, pos + 1)
    if (t1 == 0xcf or t1 == 0xd3) and (t2 == 0xcf or t2 == 0xd3) then return {a, b}, nx end
    return nil
  end
  local s = {}
  pos = pos + 1
  for k = 1, h - 0x90 do
    local t, x, nx = sunpack('>Bi8', raw, pos)
    if t ~= 0xcf and t ~= 0xd3 then return nil end
    s[k], pos = x, nx
  end
  return s, pos
end

-- unpackfast reads into st[1..n] the states of a value written by
-- packvalue under the same rules ps[1..n]. It returns whether it could,
-- the expiry the value holds (0: none), and, for one rule's state of two
-- words followed by an expiry, the 0-based offset of its first word's
-- bytes (a string, for SETRANGE: see store).
local function unpackfast(raw, ps, n, st)
  if n == 1 and sbyte(raw, 1) == 0x93 then
    -- one rule of two words, and an expiry: one struct.unpack
    local p = ps[1]
    local b = rulebytes(p)
    local pos = #b + 2
    if #raw == pos + 27 and sbyte(raw, pos) == 0x92 and ssub(raw, 2, pos - 1) == b then
      local _, t1, a, t2, c, t3, ms = sunpack('>BBi8Bi8Bi8', raw, pos)
      if (t1 == 0xcf or t1 == 0xd3) and (t2 == 0xcf or t2 == 0xd3) and t3 == 0xcf then
        st[1] = {a, c}
        local at = p.at
        if at == nil then
          at = string.format('%d', pos)
          p.at = at
        end
        return true, ms, at
      end
    end
  end
  local pos = 2
  if n < 6 then
    if sbyte(raw, 1) ~= 0x90 + 3 * n then return false end
  else
    local head = arrayhead(3 * n)
    pos = #head + 1
    if ssub(raw, 1, pos - 1) ~= head then return false end
  end
  for i = 1, n do
    local b = rulebytes(ps[i])
    if ssub(raw, pos, pos + #b - 1) ~= b then return false end
    local s, nx = unpackstate(raw, pos + #b)
    if s == nil then return false end
    st[i], pos = s, nx
  end
  if pos == #raw + 1 then return true, 0 end
  if pos + 9 ~= #raw + 1 then return false end
  local t, ms = sunpack('>Bi8', raw, pos)
  return t == 0xcf, ms
end

-- unpackvalue reads any value: the flat list of its rules' names,
-- signatures and states, and the expiry it holds (0: none).
local function unpackvalue(raw)
  local v, ms = cmsgpack.unpack(raw)
  if type(ms) ~= 'number' then ms = 0 end
  return v, ms
end

-- ttlstring returns a TTL in ms as SET's argument, a string: a Lua number
-- would be formatted with %.17g (by a slower snprintf). Each is formatted
-- once and kept (up to 1,024), since decisions close in time write the
-- same TTLs.
local ttls, nttls = {}, 0
local function ttlstring(ms)
  local t = ttls[ms]
  if t == nil then
    t = string.format('%d', ms)
    if nttls >= 1024 then ttls, nttls = {}, 0 end
    if ms == ms then ttls[ms], nttls = t, nttls + 1 end -- NaN: no key
  end
  return t
end

-- store writes key's value: states st[1..n] under rules ps[1..n], needed
-- until ms on Redis's clock when rclock (else on the caller's, which
-- Redis's TTLs do not follow), ttl ms from now (a number, formatted only
-- for a write that sets the TTL). A key whose stored
-- expiry (had, on Redis's clock; 0: unknown) is at least ms keeps its TTL.
--
-- With at (unpackfast's offset: the key holds one rule's state of two
-- words in this layout), a state of two non-negative integers that keeps
-- the TTL is written in place: SETRANGE of its 18 bytes, the same bytes
-- packvalue would write, for less than a SET (no value built, no flags
-- parsed, an integer reply).
local function store(key, ps, st, n, rclock, ms, had, ttl, at)
  if rclock and had >= ms then
    local s = st[1]
    if at and n == 1 and #s == 2 then
      local a, b = s[1], s[2]
      if a >= 0 and b >= 0 and a % 1 == 0 and b % 1 == 0 then
        redis.call('SETRANGE', key, at, spack('>Bi8Bi8', 0xcf, a, 0xcf, b))
        return
      end
    end
    redis.call('SET', key, packvalue(ps, st, n, had), 'KEEPTTL')
  elseif rclock then
    redis.call('SET', key, packvalue(ps, st, n, ms), 'PX', ttlstring(ttl))
  else
    redis.call('SET', key, packvalue(ps, st, n, 0), 'PX', ttlstring(ttl))
  end
end


-- fresh returns rule p's state before any request.
local function fresh(p)
  if p.kind == K_LOG then return {} end
  local s = {0, 0}
  if p.kind == K_COUNTER then s[3] = 0 end
  if p.kind == K_SUB then for k = 3, p.n + 2 do s[k] = 0 end end
  return s
end

-- loadstates reads key's value into st[1..n], the states of rules
-- ps[1..n] at now, by rule name: the stored state, converted (80_convert)
-- when it was stored under other parameters, or fresh. It is the one
-- reader of a key's states for every function (decide, share, write-back).
-- It returns whether the key existed; whether its value was in this
-- release's layout under exactly these rules (fast); the expiry it holds
-- (0: none); and whether the key must be written back even if nothing
-- else changes (a state converted, which happened now, or a stored rule
-- this policy no longer has, dropped at once, as the memory store
-- converts a key at a new version); and unpackfast's offset for an
-- in-place write (store), or nil. When same is a table, same[i] tells
-- whether rule i's state was stored under its own parameters.
local function loadstates(key, ps, n, st, now, same)
  local raw = redis.call('GET', key)
  if not raw then
    for i = 1, n do st[i] = fresh(ps[i]) end
    if same then for i = 1, n do same[i] = false end end
    return false, false, 0, false
  end
  local fast, had, at = unpackfast(raw, ps, n, st)
  if fast then
    if same then for i = 1, n do same[i] = true end end
    return true, true, had, false, at
  end
  local v
  v, had = unpackvalue(raw)
  local write, matched = false, 0
  for i = 1, n do
    local p = ps[i]
    local s, kept = nil, false
    for j = 1, #v, 3 do
      if v[j] == p.name then
        matched = matched + 1
        if v[j + 1] == p.sig then
          s, kept = v[j + 2], true
        else
          local oldp = parse(p.name, v[j + 1])
          s = fresh(p)
          if oldp then s = convert(oldp, v[j + 2], p, s, now) end
          write = true
        end
        break
      end
    end
    st[i] = s or fresh(p)
    if same then same[i] = kept end
  end
  return true, false, had, write or matched < #v / 3
end
