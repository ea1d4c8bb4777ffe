package main

import (
	"flag"
	"fmt"
)

// connCapConfig is `floodgate proxy`'s cap of connections per client
// address (proxy.Config.MaxConnsPerIP).
type connCapConfig struct {
	maxConnsPerIP int
}

func (c *connCapConfig) register(fs *flag.FlagSet) {
	fs.IntVar(&c.maxConnsPerIP, "max-conns-per-ip", envInt("MAX_CONNS_PER_IP", 0), "the most connections one client address (an IPv6 client's /64) may hold open at once, idle ones included, as nginx's limit_conn; one past it is answered 429 and closed; --trusted-proxies are exempt; 0: no cap [FLOODGATE_MAX_CONNS_PER_IP]")
}

func (c *connCapConfig) check() error {
	if c.maxConnsPerIP < 0 {
		return fmt.Errorf("proxy: --max-conns-per-ip %d: want 0 (no cap) or more", c.maxConnsPerIP)
	}
	return nil
}
