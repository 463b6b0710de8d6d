// go-amqp against the qgate broker: send N messages to a queue, receive them back in order.
// Usage: goamqp URL QUEUE N CA.pem [defaults]
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/Azure/go-amqp"
)

func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", a...)
	os.Exit(1)
}

func main() {
	addr, queue, ca := os.Args[1], os.Args[2], os.Args[4]
	n, err := strconv.Atoi(os.Args[3])
	if err != nil {
		fail("count: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts := &amqp.ConnOptions{SASLType: amqp.SASLTypeAnonymous()}
	if strings.HasPrefix(addr, "amqps://") {
		pem, err := os.ReadFile(ca)
		if err != nil {
			fail("ca: %v", err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		opts.TLSConfig = &tls.Config{RootCAs: pool, ServerName: "localhost"}
	}
	// "defaults": amqp.Dial with nil options, as most go-amqp users write it (no SASL layer).
	if len(os.Args) > 5 && os.Args[5] == "defaults" {
		opts = nil
	}
	conn, err := amqp.Dial(ctx, addr, opts)
	if err != nil {
		fail("dial: %v", err)
	}
	session, err := conn.NewSession(ctx, nil)
	if err != nil {
		fail("session: %v", err)
	}
	sender, err := session.NewSender(ctx, queue, nil)
	if err != nil {
		fail("sender: %v", err)
	}
	for i := 0; i < n; i++ {
		if err := sender.Send(ctx, amqp.NewMessage([]byte(fmt.Sprintf("m%d", i))), nil); err != nil {
			fail("send %d: %v", i, err)
		}
	}
	receiver, err := session.NewReceiver(ctx, queue, &amqp.ReceiverOptions{Credit: 50})
	if err != nil {
		fail("receiver: %v", err)
	}
	for i := 0; i < n; i++ {
		msg, err := receiver.Receive(ctx, nil)
		if err != nil {
			fail("receive %d: %v", i, err)
		}
		if got, want := string(msg.GetData()), fmt.Sprintf("m%d", i); got != want {
			fail("message %d: got %q want %q", i, got, want)
		}
		if err := receiver.AcceptMessage(ctx, msg); err != nil {
			fail("accept %d: %v", i, err)
		}
	}
	_ = conn.Close()
	fmt.Println("OK", n)
}
