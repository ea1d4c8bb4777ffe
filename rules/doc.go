// Package rules reads rate-limit rules files: envoyproxy/ratelimit's YAML
// configuration format, with extensions for Floodgate's engine. One file
// holds one domain; docs/RULES.md is the full reference.
//
//	domain: api                       # required, unique across files
//	all_or_nothing: false             # ext: admit a request's descriptors together
//	failure_mode: open                # ext: default for every rule: open, closed, local
//	local_percent: 25                 # ext: with failure_mode: local
//	descriptors:
//	  - key: remote_address           # required
//	    value: 10.0.0.1               # optional: absent = every value, each limited apart;
//	                                  #   '*' anywhere = wildcard (each '*' any run of bytes)
//	    value_prefix: "10.0."         # ext: instead of value
//	    value_regex: "10\\.0\\..*"    # ext: instead of value; RE2, anchored at both ends
//	    exempt: true                  # ext: values matching here are never limited
//	    exempt_values: [127.0.0.1]    # ext: on a node matching many values: these never are
//	    shadow_mode: false            # over-limit answers become OK (still counted)
//	    quota_mode: false             # over-limit answers become OK, flagged in the response
//	    detailed_metric: false        # statistics per request value
//	    value_to_metric: false        # statistics with this level's request value
//	    share_threshold: false        # wildcard: every matching value shares one limit
//	    metadata: {any: yaml}         # sent with this descriptor's status
//	    rate_limit:
//	      unit: minute                # second minute hour day week month year
//	      unit_multiplier: 1          # the window is unit_multiplier units
//	      requests_per_unit: 100      # 0 blocks every request
//	      unlimited: false            # true: never limited (no unit then)
//	      name: per_ip                # for replaces
//	      replaces: [{name: other}]   # when both match in one request, other is dropped
//	      window: 90s                 # ext: instead of unit: any Go duration
//	      calendar: month             # ext: instead of unit: day, week or month in time_zone
//	      time_zone: Europe/Paris     # ext: with calendar (default UTC)
//	      week_start: monday          # ext: with calendar: week (default sunday)
//	      algorithm: fixed_window     # ext: token_bucket leaky_bucket leaky_bucket_shaper gcra
//	                                  #   fixed_window sliding_log sliding_window sliding_subwindow
//	      burst: 200                  # ext: bucket algorithms
//	      refill: continuous          # ext: token_bucket: continuous or interval
//	      granularity: 1m             # ext: sliding_subwindow
//	      mode: hard                  # ext: hard or soft (elastic needs Go)
//	      soft_percent: 10            # ext: with mode: soft
//	      count_rejected: false       # ext: sliding_log
//	      failure_mode: open          # ext: open, closed or local
//	      local_percent: 25           # ext: with failure_mode: local
//	    rate_limits:                  # ext: instead of rate_limit: several rules, all or nothing
//	      - {name: burst, unit: second, requests_per_unit: 10}
//	      - {unit: hour, requests_per_unit: 1000}
//	    descriptors: [...]            # the next entry of the request descriptor
//
// A request descriptor (a list of entries) is matched one entry per level:
// at each level the entry's key selects the nodes, and the first that
// matches wins: the exact value, then the longest value_prefix, then the
// first value_regex, then the first wildcard value (in file order), then
// the node without a value. The walk never backtracks, and a limit applies
// only when the descriptor has exactly as many entries as the matched path
// is deep (envoyproxy/ratelimit's rules).
//
// Windows of unit are envoyproxy/ratelimit's: fixed windows aligned to the
// Unix epoch (a week 7 days from a Thursday, a month 30 days, a year 365),
// so the default algorithm is fixed_window.
//
// Parse validates a whole file and reports every problem as
// "file:line: field: message"; LoadDir loads a directory; a Config answers
// Match for each request descriptor. Hostile input is bounded: MaxFileSize,
// MaxDepth, MaxDescriptors, MaxStringLen, MaxRegexLen and MaxYAMLNodes.
package rules
