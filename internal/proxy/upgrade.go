package proxy

import (
	"bufio"
	"io"
	"net"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/floodgate/floodgate/gate"
)

// upgrade passes a protocol switch (WebSocket) through: the request goes
// to the upstream on a connection of its own; when it answers 101, the
// client's connection is hijacked and the two are piped together.
func (p *Proxy) upgrade(ctx *fasthttp.RequestCtx, pc *peerConn, v *gate.Verdict) {
	h := &ctx.Request.Header
	upgrade := append([]byte(nil), h.Peek("Upgrade")...)
	p.prepare(ctx, pc)
	h.Set("Connection", "Upgrade")
	h.SetBytesV("Upgrade", upgrade)
	conn, err := p.dial()
	if err != nil {
		p.badGateway(ctx, err)
		return
	}
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	bw := bufio.NewWriter(conn)
	_, err = bw.Write(h.Header())
	if r := &ctx.Request; err == nil && r.IsBodyStream() {
		_, err = io.Copy(bw, r.BodyStream())
	} else if err == nil {
		_, err = bw.Write(r.Body())
	}
	if err == nil {
		err = bw.Flush()
	}
	br := bufio.NewReader(conn)
	resp := &ctx.Response
	if err == nil {
		err = resp.ReadLimitBody(br, maxBufferedBody)
	}
	if err != nil {
		conn.Close()
		ctx.SetConnectionClose()
		p.badGateway(ctx, err)
		return
	}
	resp.Header.SetNoDefaultContentType(true)
	if resp.StatusCode() != fasthttp.StatusSwitchingProtocols {
		conn.Close()
		removeHop(&resp.Header)
		p.setRateLimit(&resp.Header, v)
		return
	}
	p.setRateLimit(&resp.Header, v)
	head := append([]byte(nil), resp.Header.Header()...)
	rest, _ := br.Peek(br.Buffered())
	head = append(head, rest...)
	conn.SetDeadline(time.Time{})
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(c net.Conn) {
		if _, err := c.Write(head); err != nil {
			conn.Close()
			return
		}
		pipe(c, conn)
	})
}

// pipe copies both ways until either side is done, then closes both.
func pipe(a, b net.Conn) {
	done := make(chan struct{}, 1)
	go func() {
		io.Copy(b, a) //nolint:errcheck // either side may close
		done <- struct{}{}
	}()
	io.Copy(a, b) //nolint:errcheck
	a.Close()
	b.Close()
	<-done
}
