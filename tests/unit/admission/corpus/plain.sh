#!/bin/bash
hostname
