// Package daemon is the plugin's client of astraeusd's D-Bus API
// (org.astraeus.Node1.Manager on the system bus): it translates, and
// decides nothing. docs/kubernetes.md lists the calls.
package daemon

import (
	"context"
	"errors"
	"fmt"

	"github.com/godbus/dbus/v5"
)

const (
	busName  = "org.astraeus.Node1"
	basePath = dbus.ObjectPath("/org/astraeus/Node1")
	manager  = "org.astraeus.Node1.Manager"
)

// Offer is what one GPU offers the cluster now (ListClusterOffers).
type Offer struct {
	Index   uint32
	UUID    string
	Model   string
	Bytes   uint64
	Healthy bool
	// Whole: a claim may take it whole (no local worker shares it).
	Whole bool
	// MIG: a MIG instance, offered whole only (Bytes: its memory while free).
	MIG bool
	// Withheld: why a GPU offers nothing it otherwise would ("unhealthy",
	// "held-by-host", "draining"); "" when nothing is withheld.
	Withheld string
	// Driver: the GPU driver's version ("" where none is read).
	Driver string
}

// Client talks to one daemon.
type Client struct {
	conn *dbus.Conn
}

// Connect opens the system bus, or the bus at address when it is not "".
func Connect(address string) (*Client, error) {
	var conn *dbus.Conn
	var err error
	if address == "" {
		conn, err = dbus.ConnectSystemBus()
	} else {
		conn, err = dbus.Connect(address)
	}
	if err != nil {
		return nil, fmt.Errorf("connecting to the bus: %w", err)
	}
	return &Client{conn: conn}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Refused is an error the daemon answered with: its kind
// (org.astraeus.Node1.Error.Conflict…) and its message, which names what
// was wrong in the daemon's own words (what the pod's events show).
type Refused struct {
	Kind    string
	Message string
}

func (r *Refused) Error() string { return r.Message }

func daemonError(err error) error {
	var e dbus.Error
	if errors.As(err, &e) {
		msg := e.Name
		if len(e.Body) > 0 {
			if s, ok := e.Body[0].(string); ok {
				msg = s
			}
		}
		return &Refused{Kind: e.Name, Message: msg}
	}
	return err
}

func (c *Client) call(ctx context.Context, method string, args ...any) *dbus.Call {
	return c.conn.Object(busName, basePath).CallWithContext(ctx, manager+"."+method, 0, args...)
}

// Offers lists what each GPU offers the cluster.
func (c *Client) Offers(ctx context.Context) ([]Offer, error) {
	var offers []Offer
	if err := c.call(ctx, "ListClusterOffers").Store(&offers); err != nil {
		return nil, daemonError(err)
	}
	return offers, nil
}

// Prepare books a claim's device: its worker and ASTRAEUS_GPU_MEMORY_GB.
func (c *Client) Prepare(ctx context.Context, uid, namespace, name, gpuUUID string, bytes uint64) (string, error) {
	var worker dbus.ObjectPath
	var memoryGB string
	err := c.call(ctx, "PrepareClaim", uid, namespace, name, gpuUUID, bytes).Store(&worker, &memoryGB)
	if err != nil {
		return "", daemonError(err)
	}
	return memoryGB, nil
}

// claimRow is a row of ListClaims (a(ssss)): worker, UID, namespace, name.
type claimRow struct {
	Worker    string
	UID       string
	Namespace string
	Name      string
}

// ClaimUIDs lists the UIDs of the claims the daemon holds prepared.
func (c *Client) ClaimUIDs(ctx context.Context) ([]string, error) {
	var rows []claimRow
	if err := c.call(ctx, "ListClaims").Store(&rows); err != nil {
		return nil, daemonError(err)
	}
	uids := make([]string, 0, len(rows))
	for _, r := range rows {
		uids = append(uids, r.UID)
	}
	return uids, nil
}

// Unprepare ends a claim's worker (none: no error).
func (c *Client) Unprepare(ctx context.Context, uid string) error {
	if err := c.call(ctx, "UnprepareClaim", uid).Err; err != nil {
		return daemonError(err)
	}
	return nil
}

// Changes sends on the channel returned whenever a GPU's properties
// change (what the daemon offers may have) or the daemon starts again,
// until ctx ends.
func (c *Client) Changes(ctx context.Context) (<-chan struct{}, error) {
	err := c.conn.AddMatchSignalContext(ctx,
		dbus.WithMatchInterface("org.freedesktop.DBus.Properties"),
		dbus.WithMatchMember("PropertiesChanged"),
		dbus.WithMatchPathNamespace(basePath+"/gpu"),
	)
	if err != nil {
		return nil, fmt.Errorf("watching the GPUs: %w", err)
	}
	// The daemon started again (or for the first time): what it offers
	// is read afresh, whatever it signalled before.
	err = c.conn.AddMatchSignalContext(ctx,
		dbus.WithMatchInterface("org.freedesktop.DBus"),
		dbus.WithMatchMember("NameOwnerChanged"),
		dbus.WithMatchArg(0, busName),
	)
	if err != nil {
		return nil, fmt.Errorf("watching the daemon: %w", err)
	}
	signals := make(chan *dbus.Signal, 16)
	c.conn.Signal(signals)
	out := make(chan struct{}, 1)
	go func() {
		defer c.conn.RemoveSignal(signals)
		for {
			select {
			case <-ctx.Done():
				return
			case _, ok := <-signals:
				if !ok {
					return
				}
				select {
				case out <- struct{}{}:
				default: // one pending change is enough
				}
			}
		}
	}()
	return out, nil
}
