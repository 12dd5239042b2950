// noopwebhook is the floor of any validating admission webhook: it answers every AdmissionReview
// "allowed" over TLS, using only Go's standard library, and does nothing else. The realcluster
// benchmark (benchmarks/realcluster.py) registers it with the same rules as the gate, so that
// gate / floor is what the gate costs beyond the cost of being a webhook at all (the API server's
// call, TLS, JSON, the loopback round trip).
//
//	noopwebhook -listen 127.0.0.1:0 -tls-cert tls.crt -tls-key tls.key -port-file ports.json [-deny]
//
//	POST /validate  AdmissionReview v1 in, {"response": {"uid": ..., "allowed": true}} out
//	                (with -deny: "allowed": false and a 403 status with a message, the floor of a refusal)
//	GET  /calls     how many reviews it has answered (the benchmark waits on it to know that
//	                the API server calls, or stopped calling, this webhook)
//	GET  /healthz   200
//
// It decodes the review as a webhook must (the uid comes from the request) and nothing more: the
// response format is admission.k8s.io/v1's AdmissionReview, as in
// https://github.com/kubernetes/api/blob/v0.37.2/admission/v1/types.go#L30-L38 (the review) and
// https://github.com/kubernetes/api/blob/v0.37.2/admission/v1/types.go#L122-L130 (uid, allowed)
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
)

// The API server refuses request bodies over 3 MiB, so no review is bigger; the gate caps at the same.
const maxBody = 3 << 20

type review struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Request    *struct {
		UID string `json:"uid"`
	} `json:"request"`
}

type status struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

type response struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Response   struct {
		UID     string  `json:"uid"`
		Allowed bool    `json:"allowed"`
		Status  *status `json:"status,omitempty"`
	} `json:"response"`
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve HTTPS on (port 0: any free port)")
	cert := flag.String("tls-cert", "", "serving certificate (PEM)")
	key := flag.String("tls-key", "", "serving key (PEM)")
	portFile := flag.String("port-file", "", "write {\"listen\": PORT} here once listening")
	deny := flag.Bool("deny", false, "answer every review allowed: false (403) instead of allowed")
	flag.Parse()
	if *cert == "" || *key == "" {
		log.Fatal("noopwebhook: -tls-cert and -tls-key are required")
	}

	var calls atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("POST /validate", func(w http.ResponseWriter, r *http.Request) {
		var in review
		if err := json.NewDecoder(io.LimitReader(r.Body, maxBody)).Decode(&in); err != nil || in.Request == nil {
			http.Error(w, `{"error":"not an AdmissionReview"}`, http.StatusBadRequest)
			return
		}
		var out response
		out.APIVersion, out.Kind = "admission.k8s.io/v1", "AdmissionReview"
		out.Response.UID, out.Response.Allowed = in.Request.UID, !*deny
		if *deny {
			out.Response.Status = &status{Code: 403, Message: "denied by the no-op webhook"}
		}
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(&out)
	})
	mux.HandleFunc("GET /calls", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, calls.Load())
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})

	listener, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("noopwebhook: listen on %s: %v", *listen, err)
	}
	if *portFile != "" {
		port := listener.Addr().(*net.TCPAddr).Port
		body := []byte(`{"listen": ` + strconv.Itoa(port) + "}\n")
		// Written whole under another name, then renamed: a reader never sees half a file.
		if err := os.WriteFile(*portFile+".tmp", body, 0o644); err != nil {
			log.Fatal(err)
		}
		if err := os.Rename(*portFile+".tmp", *portFile); err != nil {
			log.Fatal(err)
		}
	}
	server := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second}
	go func() {
		stop := make(chan os.Signal, 1)
		signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
		<-stop
		_ = server.Close()
	}()
	if err := server.ServeTLS(listener, *cert, *key); err != nil && err != http.ErrServerClosed {
		log.Fatalf("noopwebhook: %v", err)
	}
}
