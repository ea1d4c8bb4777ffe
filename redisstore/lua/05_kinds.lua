-- Algorithm numbers, as internal/algo.Kind.
local K_TOKEN, K_INTERVAL, K_METER, K_SHAPER, K_GCRA = 1, 2, 3, 4, 5
local K_FIXED, K_LOG, K_COUNTER, K_SUB = 6, 7, 8, 9
