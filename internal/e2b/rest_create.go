package e2b

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/daemon"
	"github.com/forkbox/forkbox/internal/store"
)

// Bounds of a create's metadata.
const (
	maxMetadata      = 64
	maxMetadataBytes = 16 << 10
)

// newSandboxJSON is E2B's NewSandbox. Fields forkbox cannot honour are
// refused, not ignored.
type newSandboxJSON struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int64            `json:"timeout"`
	AutoPause           *bool             `json:"autoPause"`
	AutoPauseMemory     *bool             `json:"autoPauseMemory"`
	AutoResume          *autoResumeJSON   `json:"autoResume"`
	Secure              *bool             `json:"secure"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             *networkJSON      `json:"network"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	Mcp                 json.RawMessage   `json:"mcp"`
	Iam                 json.RawMessage   `json:"iam"`
	VolumeMounts        []json.RawMessage `json:"volumeMounts"`
}

type autoResumeJSON struct {
	Enabled bool `json:"enabled"`
}

type networkJSON struct {
	AllowOut           []string        `json:"allowOut"`
	DenyOut            []string        `json:"denyOut"`
	AllowPublicTraffic *bool           `json:"allowPublicTraffic"`
	EgressProxy        json.RawMessage `json:"egressProxy"`
	MaskRequestHost    *string         `json:"maskRequestHost"`
	Rules              json.RawMessage `json:"rules"`
	HTTPSPorts         json.RawMessage `json:"httpsPorts"`
}

func isSet(m json.RawMessage) bool { return len(m) > 0 && string(m) != "null" }

// egress maps E2B's internet switch and network lists to a forkbox egress
// policy. Nothing given keeps forkbox's default (no egress).
func egress(allowInternet *bool, n *networkJSON) (mode string, allow, deny []string, err error) {
	if n != nil {
		switch {
		case isSet(n.EgressProxy):
			return "", nil, nil, notServed("network.egressProxy")
		case isSet(n.Rules):
			return "", nil, nil, notServed("network.rules (request transforms)")
		case n.MaskRequestHost != nil:
			return "", nil, nil, notServed("network.maskRequestHost")
		case isSet(n.HTTPSPorts):
			return "", nil, nil, notServed("network.httpsPorts")
		case n.AllowPublicTraffic != nil && !*n.AllowPublicTraffic:
			return "", nil, nil, notServed("network.allowPublicTraffic=false (forkbox port URLs always need the sandbox's token)")
		}
	}
	var allowOut, denyOut []string
	if n != nil {
		allowOut, denyOut = n.AllowOut, n.DenyOut
	}
	denyAll := slices.Contains(denyOut, "0.0.0.0/0")
	switch {
	case len(allowOut) > 0 && (denyAll || (allowInternet != nil && !*allowInternet)):
		return "allow", allowOut, nil, nil
	case len(allowOut) > 0:
		return "", nil, nil, notServed("network.allowOut without denying everything else (forkbox's allow list is the whole policy: add denyOut [\"0.0.0.0/0\"])")
	case denyAll || (allowInternet != nil && !*allowInternet):
		return "none", nil, nil, nil
	case len(denyOut) > 0:
		return "all", nil, denyOut, nil
	case allowInternet != nil && *allowInternet:
		return "all", nil, nil, nil
	}
	return "", nil, nil, nil
}

func checkMetadata(md map[string]string) error {
	n := 0
	for k, v := range md {
		n += len(k) + len(v)
	}
	if len(md) > maxMetadata || n > maxMetadataBytes {
		return fmt.Errorf("metadata: %d keys, %d bytes: at most %d keys and %d bytes: %w", len(md), n, maxMetadata, maxMetadataBytes, errdefs.ErrInvalidArgument)
	}
	return nil
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var req newSandboxJSON
	if err := decode(w, r, &req); err != nil {
		fail(w, err)
		return
	}
	sb, template, err := s.createSandbox(r.Context(), &req)
	if err != nil {
		fail(w, err)
		return
	}
	reply(w, http.StatusCreated, s.toSandbox(sb, template))
}

func (s *Server) createSandbox(ctx context.Context, req *newSandboxJSON) (*store.Sandbox, string, error) {
	switch {
	case isSet(req.Mcp):
		return nil, "", notServed("mcp (E2B's MCP gateway; forkbox serves MCP itself: `forkbox mcp`)")
	case isSet(req.Iam):
		return nil, "", notServed("iam (workload identity tokens)")
	case len(req.VolumeMounts) > 0:
		return nil, "", notServed("volumeMounts")
	case req.AutoPauseMemory != nil && !*req.AutoPauseMemory:
		return nil, "", notServed("autoPauseMemory=false (a forkbox pause keeps memory)")
	}
	if req.TemplateID == "" {
		return nil, "", fmt.Errorf("templateID is required: %w", errdefs.ErrInvalidArgument)
	}
	if err := checkID("template", req.TemplateID); err != nil {
		return nil, "", err
	}
	if err := checkMetadata(req.Metadata); err != nil {
		return nil, "", err
	}
	timeout, err := seconds(req.Timeout)
	if err != nil {
		return nil, "", err
	}
	if req.Timeout == nil {
		timeout = 15 * time.Second // E2B's default
	}
	mode, allow, deny, err := egress(req.AllowInternetAccess, req.Network)
	if err != nil {
		return nil, "", err
	}
	o := daemon.Overrides{Env: req.EnvVars, Timeout: timeout, OnTimeout: daemon.OnTimeoutClose,
		Egress: mode, EgressAllow: allow, EgressDeny: deny}
	if req.AutoPause != nil && *req.AutoPause {
		o.OnTimeout = daemon.OnTimeoutHibernate
	}
	template := req.TemplateID
	from := template
	if from == "base" && s.cfg.DefaultTemplate != "" {
		from = s.cfg.DefaultTemplate
	}
	sb, err := s.startTemplate(ctx, from, o)
	if err != nil {
		return nil, "", err
	}
	if err := s.d.Store().PutE2BObject(ctx, &store.E2BObject{ID: sb.ID, Kind: store.E2BKindSandbox, Template: template, Metadata: req.Metadata}); err != nil {
		s.d.Delete(context.WithoutCancel(ctx), sb.ID)
		return nil, "", err
	}
	return sb, template, nil
}

// startTemplate starts a sandbox from what templateID names, in this order:
// a snapshot taken through this endpoint (by id or name), a forkbox
// environment, an image.
func (s *Server) startTemplate(ctx context.Context, templateID string, o daemon.Overrides) (*store.Sandbox, error) {
	if ck, err := s.snapshotByName(ctx, templateID); err == nil {
		return s.d.RestoreSnapshot(ctx, ck, o, nil)
	}
	if _, err := s.d.GetEnvironment(ctx, templateID); err == nil {
		res, err := s.d.EnvironmentSandbox(ctx, nil, templateID, o)
		if err != nil {
			return nil, err
		}
		return res.Sandbox, nil
	}
	sb, err := s.d.Create(ctx, daemon.CreateOptions{Image: templateID, Env: o.Env, Timeout: o.Timeout, OnTimeout: o.OnTimeout,
		Egress: o.Egress, EgressAllow: o.EgressAllow, EgressDeny: o.EgressDeny})
	if errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("template %q is no snapshot, forkbox environment or image of this daemon (%v): %w", templateID, err, errdefs.ErrNotFound)
	}
	return sb, err
}
