// A third-party HTTP/3 peer for qgate's interop tests, on quic-go (github.com/quic-go/quic-go).
//
//	quicgo-peer device HOST PORT -ca CA [-records N] ...   an IoT device: register with a qgate
//	    gateway (POST /register), then POST each record to /ingest/STREAM with the Hash ID,
//	    retrying a record the gateway answers 502/503 for; prints one JSON line.
//	quicgo-peer server PORT -pki DIR                       a plain HTTP/3 server for qgate's own
//	    clients: GET → 200 "hello from quic-go", POST → 201 {"bytes": N, "sha256": ...}; its
//	    certificate (ECDSA P-256, for localhost and 127.0.0.1) is issued by a CA it makes and
//	    writes to DIR/ca.pem; prints "listening" once it is.
//
// Everything here is this project's code; quic-go provides the QUIC and HTTP/3 layers.
package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: quicgo-peer device HOST PORT -ca CA [flags] | server PORT -pki DIR")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "device":
		err = device(os.Args[2:])
	case "server":
		err = server(os.Args[2:])
	default:
		err = fmt.Errorf("unknown role %q: device or server", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "quicgo-peer:", err)
		os.Exit(1)
	}
}

// positional splits HOST PORT (or PORT) off the front of args, so flags may follow them.
func positional(args []string, n int) ([]string, []string, error) {
	if len(args) < n {
		return nil, nil, fmt.Errorf("expected %d positional arguments", n)
	}
	return args[:n], args[n:], nil
}

type report struct {
	Stack         string         `json:"stack"`
	Records       int            `json:"records"`
	Created       int            `json:"created"`
	Statuses      map[string]int `json:"statuses"`
	Retries       int            `json:"retries"`
	HashIDDigits  int            `json:"hash_id_hex_digits"`
	WithoutHashID int            `json:"without_hash_id"`
}

func device(args []string) error {
	pos, rest, err := positional(args, 2)
	if err != nil {
		return err
	}
	fs := flag.NewFlagSet("device", flag.ContinueOnError)
	ca := fs.String("ca", "", "CA certificate the gateway's is checked against")
	serverName := fs.String("server-name", "qgate.test", "name the gateway's certificate is checked for")
	records := fs.Int("records", 20, "records to post")
	bodyBytes := fs.Int("body-bytes", 200, "bytes per record")
	stream := fs.String("stream", "quicgo", "ingest stream name")
	tag := fs.String("tag", "quicgo", "text each record starts with")
	priority := fs.Bool("priority", false, "register as a priority device")
	attempts := fs.Int("attempts", 50, "tries per record (502/503 retried)")
	timeout := fs.Duration("timeout", 20*time.Second, "per request")
	certFile := fs.String("cert", "", "this device's certificate (PEM), for a gateway with a device CA")
	keyFile := fs.String("key", "", "the private key of -cert (PEM)")
	if err := fs.Parse(rest); err != nil {
		return err
	}
	var certs []tls.Certificate
	if *certFile != "" {
		c, err := tls.LoadX509KeyPair(*certFile, *keyFile)
		if err != nil {
			return err
		}
		certs = append(certs, c)
	}
	pemBytes, err := os.ReadFile(*ca)
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pemBytes) {
		return fmt.Errorf("%s holds no certificate", *ca)
	}
	tr := &http3.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: *serverName, Certificates: certs},
		QUICConfig:      &quic.Config{MaxIdleTimeout: 30 * time.Second},
	}
	defer tr.Close()
	client := &http.Client{Transport: tr, Timeout: *timeout}
	base := "https://" + net.JoinHostPort(pos[0], pos[1])
	ask := func(path string, headers map[string]string, body []byte) (int, []byte, error) {
		req, err := http.NewRequest(http.MethodPost, base+path, bytes.NewReader(body))
		if err != nil {
			return 0, nil, err
		}
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, b, err
	}
	prio := "0"
	if *priority {
		prio = "1"
	}
	status, body, err := ask("/register", map[string]string{"qgate-priority": prio}, nil)
	if err != nil {
		return fmt.Errorf("register: %w", err)
	}
	if status != http.StatusCreated {
		return fmt.Errorf("registration refused: %d %s", status, body)
	}
	var reg struct {
		HashID string `json:"hash_id"`
	}
	if err := json.Unmarshal(body, &reg); err != nil {
		return fmt.Errorf("registration answer %q: %w", body, err)
	}
	r := report{Stack: "quic-go", Records: *records, Statuses: map[string]int{}, HashIDDigits: len(reg.HashID)}
	for i := 0; i < *records; i++ {
		record := []byte(fmt.Sprintf("%s record %d ", *tag, i))
		for len(record) < *bodyBytes {
			record = append(record, '.')
		}
		for attempt := 0; ; attempt++ {
			status, _, err = ask("/ingest/"+*stream, map[string]string{"qgate-hash-id": reg.HashID}, record)
			if err != nil {
				return fmt.Errorf("record %d: %w", i, err)
			}
			if (status != 502 && status != 503) || attempt+1 == *attempts {
				break
			}
			r.Retries++
			time.Sleep(200 * time.Millisecond)
		}
		r.Statuses[strconv.Itoa(status)]++
		if status == http.StatusCreated {
			r.Created++
		}
	}
	// A request without the Hash ID is refused, not forwarded.
	if r.WithoutHashID, _, err = ask("/ingest/"+*stream, nil, []byte("no hash id")); err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(r)
}

// issue makes a CA and a server certificate it signs for localhost, writing the CA to dir/ca.pem.
func issue(dir string) (tls.Certificate, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "quicgo-peer interop CA"},
		NotBefore:             now.Add(-5 * time.Minute),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return tls.Certificate{}, err
	}
	leafTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(2),
		Subject:               pkix.Name{CommonName: "localhost"},
		NotBefore:             now.Add(-5 * time.Minute),
		NotAfter:              now.Add(24 * time.Hour),
		DNSNames:              []string{"localhost"},
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return tls.Certificate{}, err
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	if err := os.WriteFile(filepath.Join(dir, "ca.pem"), caPEM, 0o644); err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: key}, nil
}

func server(args []string) error {
	pos, rest, err := positional(args, 1)
	if err != nil {
		return err
	}
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	pki := fs.String("pki", "", "directory for its CA and certificate")
	listen := fs.String("listen", "127.0.0.1", "address to listen on")
	if err := fs.Parse(rest); err != nil {
		return err
	}
	cert, err := issue(*pki)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost {
			io.WriteString(w, "hello from quic-go\n")
			return
		}
		body, err := io.ReadAll(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		sum := sha256.Sum256(body)
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(map[string]any{"bytes": len(body), "sha256": hex.EncodeToString(sum[:])})
	})
	conn, err := net.ListenPacket("udp", net.JoinHostPort(*listen, pos[0]))
	if err != nil {
		return err
	}
	srv := &http3.Server{
		Handler:   mux,
		TLSConfig: http3.ConfigureTLSConfig(&tls.Config{Certificates: []tls.Certificate{cert}}),
		// Small windows, so a client's large body needs flow-control updates.
		QUICConfig: &quic.Config{
			InitialStreamReceiveWindow:     64 << 10,
			MaxStreamReceiveWindow:         64 << 10,
			InitialConnectionReceiveWindow: 128 << 10,
			MaxConnectionReceiveWindow:     128 << 10,
		},
	}
	fmt.Println("listening")
	return srv.Serve(conn)
}
